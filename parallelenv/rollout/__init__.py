"""VecWorker: collect experience from a ParallelEnv with an agent, one level above the vector env.

The agent is the ``policy`` argument (garage's word for it: the callable
that maps observations to actions); here it is called the agent, since a
ParallelEnv's ``policy`` is its ``asynchronous`` rule for finished envs
(:class:`parallelenv.policies.Policy`).

The worker keeps every env in an episode at all times, whatever the
ParallelEnv's ``asynchronous`` rule:

- ``"restart"``: the env host resets a finished env in the same step; the
  worker reads the ended episode's last obs from ``info["ended_state"]``.
- ``"idle"`` and ``"continue"``: the step returns a finished env's real last
  obs; the worker resets that env before the next step, so it never sees
  None results (``"idle"``) or steps a finished env (``"continue"``).
- ``None``: when one env finishes, the rule finishes them all. The worker
  records the other envs' episodes as *truncated* at that step (their
  ``next_obs`` is their real obs, good for bootstrapping) and resets every env.

``max_episode_length`` cuts episodes the same way, as truncations.

``overlap=True`` is Sample Factory's double-buffered sampling over the
ParallelEnv's ``send``/``recv``: :meth:`VecWorker.collect` splits the envs
into two halves and computes one half's actions while the other half steps,
so that neither the agent nor the envs wait for each other. The halves are
the even and the odd env ids, so that each holds half of every worker's
envs (:mod:`parallelenv.rollout.overlap` says why). Each env sees the same actions in
the same order as without overlap, provided the agent acts on each row
alone (it is called on half batches). Under ``asynchronous=None`` one env's
end ends every env's episode, so a half cannot start its next step before
the other half's results are in: the results are the same, the overlap is
lost. :mod:`parallelenv.rollout.overlap` runs it; :mod:`parallelenv.rollout.settling` settles
each step (episode ends, resets) and :mod:`parallelenv.rollout.episode_record` keeps
the steps the episode API hands over as whole episodes.

``seed`` and ``worker_number`` play garage's parts: workers built with one
base seed and different worker numbers give their envs distinct seeds, each
derived with ``numpy.random.SeedSequence`` (``VecWorker.env_seeds`` lists them).

Results are NumPy arrays or torch tensors on a chosen device, converted at
the worker's boundary. A ParallelEnv that returns tensors keeps them on its
device; the worker reads only rewards and done flags on the host, for its
episode statistics and for resetting.
"""

from parallelenv.rollout.timings import CollectionTimes
from parallelenv.rollout.trajectories import EpisodeBatch, StepFields, Transitions
from parallelenv.rollout.vec_worker import OUTPUTS, VecWorker

__all__ = ["OUTPUTS", "CollectionTimes", "EpisodeBatch", "StepFields", "Transitions", "VecWorker"]
