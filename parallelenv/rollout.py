"""VecWorker: collect experience from a ParallelEnv with a policy, one level above the vector env.

The worker keeps every env in an episode at all times, whatever the
ParallelEnv's ``asynchronous`` policy:

- ``"restart"``: the env host resets a finished env in the same step; the
  worker reads the ended episode's last obs from ``info["ended_state"]``.
- ``"idle"`` and ``"continue"``: the step returns a finished env's real last
  obs; the worker resets that env before the next step, so it never sees
  None results (``"idle"``) or steps a finished env (``"continue"``).
- ``None``: when one env finishes, the policy finishes them all. The worker
  records the other envs' episodes as *truncated* at that step (their
  ``next_obs`` is their real obs, good for bootstrapping) and resets every env.

``max_episode_length`` cuts episodes the same way, as truncations.

``overlap=True`` is Sample Factory's double-buffered sampling over the
ParallelEnv's ``send``/``recv``: :meth:`VecWorker.collect` splits the envs
into two halves and computes one half's actions while the other half steps,
so that neither the policy nor the envs wait for each other. The halves are
the even and the odd env ids: a worker process or Ray actor hosts a run of
consecutive ids and steps them one after another, so a half's step takes
about half a whole step's time only if the half holds about half of every
worker's envs (with halves of consecutive ids, one half would be whole
workers, as slow to step as every env). Each env sees the same actions in
the same order as without overlap, provided the policy acts on each row
alone (it is called on half batches). Under ``asynchronous=None`` one env's
end ends every env's episode, so a half cannot start its next step before
the other half's results are in: the results are the same, the overlap is
lost. :mod:`parallelenv.overlap` runs it.

``seed`` and ``worker_number`` play garage's parts: workers built with one
base seed and different worker numbers give their envs distinct seeds, each
derived with ``numpy.random.SeedSequence`` (``VecWorker.env_seeds`` lists them).

Results are NumPy arrays or torch tensors on a chosen device, converted at
the worker's boundary. A ParallelEnv that returns tensors keeps them on its
device; the worker reads only rewards and done flags on the host, for its
episode statistics and for resetting.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from parallelenv import arguments
from parallelenv.arrays import (
    Tree,
    copy_tree,
    first_leaf,
    is_tensor,
    put_masked,
    put_row,
    put_rows,
    stack,
    to_numpy,
    to_torch,
    tree_map,
)
from parallelenv.batching import check_batch
from parallelenv.infos import ended_states, step_info
from parallelenv.overlap import CollectsOverlapped
from parallelenv.parallel_env import ParallelEnv
from parallelenv.trajectories import EpisodeBatch, StepFields, Transitions

OUTPUTS = ("auto", "numpy", "torch")


@dataclass(frozen=True)
class _Step(StepFields):
    """One step of every env, in the worker's output format, with its vector info."""

    info: dict[str, Any]


@dataclass(frozen=True)
class _Settled:
    """One step of some envs, recorded, and where it left them."""

    step: _Step
    ended: np.ndarray  # the envs whose episode ended with it
    obs: Tree  # their obs for the next step: a new episode's first where one ended
    returns: list[float]  # of the episodes that ended, in env order
    lengths: list[int]


class VecWorker(CollectsOverlapped):
    """Runs a policy on a ParallelEnv and hands back transitions or whole episodes.

    Args:
        penv: the envs. :meth:`shutdown` closes it.
        policy: a callable from a batch of observations to a batch of
            actions (NumPy arrays or torch tensors), e.g. a ``torch.nn.Module``.
            It receives observations in the worker's output format.
        max_episode_length: cut episodes after this many steps (as truncations).
        output: ``"numpy"``, ``"torch"``, or ``"auto"``: what the ParallelEnv
            returns (NumPy for the CPU backends, tensors for the tensor backend).
        device: torch device of the results with ``output="torch"``; default:
            the device of the ParallelEnv's tensors, else ``"cpu"``.
        seed: the seeds of the envs' first reset (:meth:`worker_init`): None
            (unseeded), a base seed, or a list with one seed per env, used as given.
        worker_number: which worker this is, among workers built with one
            base seed (garage's ``worker_number``): env ``i`` of worker ``w``
            gets the seed of ``SeedSequence(seed, spawn_key=(w, i))``, so no two
            envs of such workers share a seed or a stream, as ``seed + w`` or
            ``seed + i`` would. :attr:`env_seeds` lists them.
        overlap: let :meth:`collect` step one half of the envs (the even
            ids, or the odd ones, so that each half holds half of every
            worker's envs) while the policy computes the other half's
            actions (see the module's docstring). The policy is then called
            on half batches and must act on each row alone, as a network
            without batch statistics does; each env then sees the same
            actions, in the same order, as without overlap. It hides the
            envs' waiting behind the policy, at the price of a second send
            and recv per step and of two policy calls on half batches: it
            pays where the envs wait on cores of their own (I/O, a renderer,
            a simulator in another process; a subproc worker per env, or
            Ray) and a half batch costs the policy about half a batch's
            time. Measure it
            (``python -m benchmarks --workloads collect16``). The episode
            API (:meth:`step_episode`, :meth:`rollout`) steps every env
            together either way. Needs two envs or more, and NumPy results
            (the tensor backend's steps are already asynchronous on its device).

    Example:
        >>> import numpy as np
        >>> from parallelenv import ParallelEnv
        >>> from parallelenv.rollout import VecWorker
        >>> penv = ParallelEnv.make("CartPole-v1", num_envs=4, para_mode="dummy", asynchronous="restart")
        >>> worker = VecWorker(penv, lambda obs: (obs[:, 2] > 0).astype(np.int64), seed=0, worker_number=1)
        >>> batch = worker.collect(64)
        >>> batch.obs.shape, batch.next_obs.shape, batch.reward.shape
        ((64, 4, 4), (64, 4, 4), (64, 4))
        >>> len(set(worker.env_seeds))
        4
        >>> worker.shutdown()
    """

    def __init__(
        self,
        penv: ParallelEnv,
        policy: Callable[[Any], Any],
        *,
        max_episode_length: int | None = None,
        output: str = "auto",
        device: Any = None,
        seed: Any = None,
        worker_number: int = 0,
        overlap: bool = False,
    ) -> None:
        if not isinstance(penv, ParallelEnv):
            raise TypeError(f"penv must be a ParallelEnv, not {type(penv).__name__}")
        if not callable(policy):
            raise TypeError(f"policy must be callable (observations -> actions), not {type(policy).__name__}")
        if max_episode_length is not None and (not isinstance(max_episode_length, int) or max_episode_length < 1):
            raise ValueError(f"max_episode_length={max_episode_length!r}; use a positive int or None")
        if output not in OUTPUTS:
            raise ValueError(f"output={output!r}; use one of {', '.join(map(repr, OUTPUTS))}")
        if not isinstance(worker_number, int) or isinstance(worker_number, bool) or worker_number < 0:
            raise ValueError(f"worker_number={worker_number!r}; use a non-negative int")
        if not isinstance(overlap, bool):
            raise TypeError(f"overlap must be True or False, not {overlap!r}")
        if overlap and len(penv) < 2:
            raise ValueError(f"overlap=True steps two halves of the envs in turn; this ParallelEnv has {len(penv)} env")
        self.penv = penv
        self.policy = policy
        self.max_episode_length = max_episode_length
        self.output = output
        self.device = device
        n = self.num_envs = len(penv)
        self.seed = seed
        self.worker_number = worker_number
        self.overlap = overlap
        # Even and odd ids: a worker steps its envs (a run of consecutive ids)
        # one after another, so a half's step takes half the time of a whole
        # step only if each half has half of every worker's envs.
        self._halves = (np.arange(0, n, 2, dtype=np.int64), np.arange(1, n, 2, dtype=np.int64))
        #: The seed each env's first reset gets (None: unseeded), in env order.
        self.env_seeds: tuple[int | None, ...] = self._env_seeds(seed)
        self._obs: Tree = None  # the current obs, in the output format; None until started
        self._env_is_torch = False
        self._env_device: Any = None  # where a tensor ParallelEnv keeps its results
        self._returns = np.zeros(n)
        self._lengths = np.zeros(n, dtype=np.int64)
        # The episode API's record: steps since the oldest episode in progress.
        self._steps: list[_Step] = []
        self._first_step = 0  # the step number of self._steps[0]
        self._step_count = 0
        self._episode_start = np.full(n, -1, dtype=np.int64)  # -1: this episode is not recorded
        self._completed: list[EpisodeBatch] = []
        self._recording = False

    def __enter__(self) -> VecWorker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ updates

    def update_agent(self, policy_or_params: Any) -> None:
        """Use a new policy, or load new parameters into the current one.

        Args:
            policy_or_params: a callable replaces the policy; a mapping is
                loaded with the policy's ``load_state_dict`` (a torch module's
                ``state_dict()``); anything else goes to the policy's
                ``set_param_values`` method, where it has one.
        """
        if callable(policy_or_params):
            self.policy = policy_or_params
        elif isinstance(policy_or_params, Mapping) and hasattr(self.policy, "load_state_dict"):
            self.policy.load_state_dict(policy_or_params)
        elif hasattr(self.policy, "set_param_values"):
            self.policy.set_param_values(policy_or_params)
        else:
            raise TypeError(
                f"cannot update a {type(self.policy).__name__} policy with a {type(policy_or_params).__name__}: "
                "pass a new callable, a state dict for a policy with load_state_dict, or parameters "
                "for a policy with set_param_values"
            )

    def update_env(self, updates: Mapping[int, Any]) -> None:
        """Replace envs, or set their attributes, by env index.

        Args:
            updates: ``{env index: update}`` where an update is a ``gym.Env``
                or a zero-argument factory of one (the env is replaced, reset,
                and starts a new episode; its episode in progress is dropped),
                or a ``{name: value}`` dict of attributes to set (the episode goes on).
        """
        if not isinstance(updates, Mapping):
            raise TypeError(f"updates must be a mapping from env index to an update, not {type(updates).__name__}")
        ids = arguments.env_ids(list(updates), self.num_envs).tolist() if updates else []
        for i in ids:  # every update is checked before any is applied
            if not isinstance(updates[i], (Mapping, gym.Env)) and not callable(updates[i]):
                raise TypeError(
                    f"the update of env {i} is a {type(updates[i]).__name__}: use a gym.Env, a factory of one, "
                    "or a dict of attributes"
                )
        for i in ids:
            if isinstance(updates[i], Mapping):
                for name, value in updates[i].items():
                    self.penv.set_env_attr(name, value, id=[i])
        replaced = [i for i in ids if not isinstance(updates[i], Mapping)]
        if replaced:
            self.penv.replace_envs([updates[i] for i in replaced], id=replaced)
            if self._obs is not None:
                self._restart_envs(np.array(replaced, dtype=np.int64), record=False)

    # ------------------------------------------------------------------ episodes

    def worker_init(self) -> None:
        """Reset every env with its seed of :attr:`env_seeds` and begin an episode in each.

        The first :meth:`collect`, :meth:`step_episode` or :meth:`rollout`
        calls it when nothing has started the envs yet; calling it again
        resets the envs from the same seeds again.
        """
        self.start_episode(self.seed)

    def start_episode(self, seed: Any = None) -> None:
        """Reset every env and begin recording a new episode in each.

        Args:
            seed: None continues each env's random stream; a base seed or a
                list gives the envs their seeds as ``seed`` of the constructor does.
        """
        obs, _ = self.penv.reset(seed=None if seed is None else list(self._env_seeds(seed)))
        leaf = first_leaf(obs)
        self._env_is_torch = is_tensor(leaf)
        self._env_device = leaf.device if self._env_is_torch else None
        self._obs = self._out(obs)
        self._returns[:] = 0
        self._lengths[:] = 0
        self._steps, self._first_step = [], self._step_count
        self._episode_start[:] = self._step_count
        self._recording = True

    def step_episode(self) -> bool:
        """Step every env once; True when at least one episode completed (see :meth:`collect_episode`)."""
        self._ensure_started()
        if not self._recording:
            self._steps, self._first_step = [], self._step_count
            self._recording = True
        settled = self._step_every_env()
        ended = settled.ended
        self._steps.append(settled.step)
        for i in np.flatnonzero(ended).tolist():
            if self._episode_start[i] >= 0:
                self._completed.append(self._episode(i))
            self._episode_start[i] = self._step_count
        self._forget_old_steps()
        return bool(ended.any())

    def collect_episode(self) -> EpisodeBatch:
        """The episodes completed by :meth:`step_episode` since the last call (possibly none)."""
        completed, self._completed = self._completed, []
        if not completed:
            return EpisodeBatch.empty(self.penv.single_observation_space, self.penv.single_action_space, self._out)
        return EpisodeBatch.concatenate(completed)

    def rollout(self) -> EpisodeBatch:
        """Start an episode in every env and run until one completes; returns the completed one(s)."""
        if self._obs is None:
            self.worker_init()  # the first start gives the envs their seeds
        else:
            self.start_episode()
        self._completed = []
        while not self.step_episode():
            pass
        return self.collect_episode()

    # ------------------------------------------------------------------ transitions

    def collect(self, num_steps: int, progress: bool = False) -> Transitions:
        """Step every env ``num_steps`` times, going on from where the last call stopped.

        Args:
            num_steps: steps of the whole ParallelEnv; the batch holds
                ``num_steps * num_envs`` transitions.
            progress: show a tqdm progress bar (needs tqdm).

        Episodes in progress when it starts are not reported by a later
        :meth:`collect_episode`: collect records transitions, not episodes.
        With ``overlap=True`` the halves step in turn (see the constructor).
        """
        if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
            raise ValueError(f"num_steps={num_steps!r}; use a positive int")
        self._ensure_started()
        self._recording = False
        self._steps, self._completed = [], []
        self._episode_start[:] = -1
        if self.overlap:
            return self._collect_overlapped(num_steps, _progress(range(num_steps), progress))
        returns: list[float] = []
        lengths: list[int] = []
        steps: list[StepFields] = []
        for _ in _progress(range(num_steps), progress):
            settled = self._step_every_env()
            steps.append(settled.step)
            returns.extend(settled.returns)
            lengths.extend(settled.lengths)
        return Transitions.from_steps(steps, returns, lengths)

    def shutdown(self) -> None:
        """Close the ParallelEnv; safe to call again."""
        self.penv.close()

    # ------------------------------------------------------------------ the step

    def _ensure_started(self) -> None:
        if self._obs is None:
            self.worker_init()

    def _env_seeds(self, seed: Any) -> tuple[int | None, ...]:
        """One seed per env: a base seed's children of this worker, a list as given, None unseeded."""
        checked = arguments.seed_argument(seed, np.arange(self.num_envs))
        if checked is None:
            return (None,) * self.num_envs
        if isinstance(checked, tuple):
            return checked
        return tuple(
            int(np.random.SeedSequence(checked, spawn_key=(self.worker_number, i)).generate_state(1, np.uint64)[0])
            for i in range(self.num_envs)
        )

    @property
    def _every(self) -> slice:
        return slice(0, self.num_envs)

    def _step_every_env(self) -> _Settled:
        """Step every env once with the policy's actions; restart the episodes that ended."""
        obs = self._obs
        action, env_action = self._act(obs, self._every)
        results = self.penv.step(env_action)
        if self.penv.reuses_result_buffers:  # the next step would overwrite the steps kept here
            results = copy_tree(results)
        settled = self._settle(self._every, obs, action, results)
        self._obs = settled.obs
        self._step_count += 1
        return settled

    def _settle(self, rows: slice | np.ndarray, obs: Tree, action: Tree, results: Any) -> _Settled:
        """Record one step of the envs of ``rows`` (every env's slice, or a half's ids; ``results``
        as ``step`` returns them for those envs); restart their episodes that ended. Both modes
        run every step through here."""
        next_obs, reward, terminated, truncated, info = results
        terminated_np = to_numpy(terminated).astype(bool)
        truncated_np = to_numpy(truncated).astype(bool)
        done = terminated_np | truncated_np
        self._returns[rows] += to_numpy(reward)
        self._lengths[rows] += 1
        next_obs, reward = self._out(next_obs), self._out(reward)
        cut = np.zeros_like(done)
        if self.max_episode_length is not None:
            cut |= (self._lengths[rows] >= self.max_episode_length) & ~done
        if self.penv.policy.ends_all and done.any():
            cut |= ~done  # the policy has finished every env (overlap settles all rows together then)
        ended = done | cut
        new_obs = next_obs
        restarted = info.get("_ended_state")
        rebuilt = _rebuilt(info)
        if restarted is not None or rebuilt is not None:
            next_obs = copy_tree(next_obs)
        if restarted is not None:  # the ``restart`` policy reset these envs: their real last obs is in the info
            if not put_masked(next_obs, restarted, info["ended_state"]):
                for p, last in ended_states(info).items():
                    put_row(next_obs, p, last)
        if rebuilt is not None:
            # Envs rebuilt after a failure (on_worker_failure / on_env_error="restart")
            # answered with their new episode's first obs: the old episode ends,
            # truncated, where its env last was, and the new one starts from that obs.
            for p in np.flatnonzero(rebuilt).tolist():
                put_row(next_obs, p, tree_map(lambda x, p=p: x[p], obs))
            restarted = rebuilt if restarted is None else to_numpy(restarted) | rebuilt
        step = _Step(obs, action, reward, self._out(terminated_np), self._out(truncated_np | cut), next_obs, info)
        if not ended.any():
            return _Settled(step, ended, new_obs, [], [])
        returns, lengths = self._returns[rows][ended].tolist(), self._lengths[rows][ended].tolist()
        restarted_np = np.zeros_like(ended) if restarted is None else to_numpy(restarted)
        new_obs = self._end_episodes(rows, new_obs, ended, restarted_np)
        return _Settled(step, ended, new_obs, returns, lengths)

    def _end_episodes(self, rows: slice | np.ndarray, obs: Tree, ended: np.ndarray, restarted: np.ndarray) -> Tree:
        """Zero the counters of ended episodes; reset the envs the ParallelEnv did not. Returns ``obs``
        (of the envs of ``rows``) with the first obs of the envs reset here."""
        ids = np.arange(self.num_envs)[rows]
        self._returns[ids[ended]] = 0
        self._lengths[ids[ended]] = 0
        to_reset = ended & ~restarted
        if not to_reset.any():
            return obs
        first, _ = self.penv.reset(id=ids[to_reset])
        obs = copy_tree(obs)
        put_rows(obs, np.flatnonzero(to_reset), self._out(first))
        return obs

    def _restart_envs(self, ids: np.ndarray, record: bool) -> None:
        """Reset ``ids`` and put their first obs into the current obs."""
        obs, _ = self.penv.reset(id=ids)
        put_rows(self._obs, ids, self._out(obs))
        if not record:  # an env replaced mid-episode: its episode so far is dropped
            self._returns[ids] = 0
            self._lengths[ids] = 0
            self._episode_start[ids] = self._step_count if self._recording else -1

    def _act(self, obs: Tree, rows: slice | np.ndarray) -> tuple[Tree, Tree]:
        """The policy's actions for the envs of ``rows`` (every env's slice, or a half's ids): as
        recorded (output format) and as the ParallelEnv takes them."""
        torch = sys.modules.get("torch")
        with torch.no_grad() if torch is not None else contextlib.nullcontext():
            action = self.policy(obs)
        if self._env_is_torch:
            env_action = to_torch(action, self._env_device)
        else:
            ids = np.arange(self.num_envs)[rows]
            try:
                env_action = check_batch(self.penv.single_action_space, to_numpy(action), len(ids),
                                         what="the policy's actions")
            except (TypeError, ValueError) as exc:
                called_on = "" if len(ids) == self.num_envs else f", called on envs {_named(ids)}"
                raise type(exc)(f"{exc} (policy {self.policy!r}{called_on})") from None
        return self._out(action), env_action

    # ------------------------------------------------------------------ formats

    def _wants_torch(self) -> bool:
        return self.output == "torch" or (self.output == "auto" and self._env_is_torch)

    def _out(self, tree: Tree) -> Tree:
        """``tree`` in the output format."""
        if self._wants_torch():
            device = self.device
            if device is None:
                device = self._env_device or "cpu"
            return to_torch(tree, device)
        return to_numpy(tree)

    # ------------------------------------------------------------------ the episode record

    def _episode(self, i: int) -> EpisodeBatch:
        """Env ``i``'s episode that ended with the last step, out of the step record."""
        records = self._steps[self._episode_start[i] - self._first_step:]

        def rows(field: str) -> Tree:
            return stack([tree_map(lambda x: x[i], getattr(r, field)) for r in records])

        last = records[-1]
        returns = float(to_numpy(stack([r.reward[i] for r in records])).sum())
        return EpisodeBatch(
            env_ids=np.array([i]),
            lengths=np.array([len(records)]),
            returns=np.array([returns]),
            observations=rows("obs"),
            actions=rows("action"),
            rewards=rows("reward"),
            terminations=rows("terminated"),
            truncations=rows("truncated"),
            infos=[step_info(r.info, i) for r in records],
            last_observations=tree_map(lambda x: x[i : i + 1], last.next_obs),
        )

    def _forget_old_steps(self) -> None:
        """Drop recorded steps that no recorded episode in progress needs."""
        live = self._episode_start[self._episode_start >= 0]
        oldest = int(live.min()) if live.size else self._step_count
        if oldest > self._first_step:
            del self._steps[: oldest - self._first_step]
            self._first_step = oldest


def _rebuilt(info: dict[str, Any]) -> np.ndarray | None:
    """The mask of envs rebuilt after a failure in this step, or None when none was."""
    masks = [to_numpy(info[key]).astype(bool) for key in ("_worker_restarted", "_env_restarted") if key in info]
    if not masks:
        return None
    return np.logical_or.reduce(masks)


def _named(ids: np.ndarray) -> str:
    """Env ids for an error message: the first few of many."""
    shown = ids[:6].tolist()
    return str(shown) if len(ids) <= 6 else f"{str(shown)[:-1]}, ... ({len(ids)} envs)]"


def _progress(steps: Iterable[int], show: bool) -> Iterator[int]:
    if not show:
        return iter(steps)
    try:
        from tqdm.auto import tqdm
    except ImportError as exc:
        raise ImportError("progress=True needs tqdm: pip install tqdm") from exc
    return iter(tqdm(steps, desc="collect", unit="step"))
