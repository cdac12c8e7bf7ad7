"""VecWorker: an agent stepping a ParallelEnv, one level above the vector env (see :mod:`parallelenv.rollout`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from parallelenv import arguments
from parallelenv.arrays import Tree, copy_tree, first_leaf, is_tensor, put_rows, to_numpy, to_torch
from parallelenv.extras import missing_extra
from parallelenv.parallel_env import ParallelEnv
from parallelenv.rollout.agent import agent_actions, updated_agent
from parallelenv.rollout.episode_record import EpisodeRecord
from parallelenv.rollout.overlap import CollectsOverlapped
from parallelenv.rollout.saving import SavesCollections
from parallelenv.rollout.settling import Settled, Settler
from parallelenv.rollout.timings import TimesCollections
from parallelenv.rollout.trajectories import EpisodeBatch, StepFields, Transitions

OUTPUTS = ("auto", "numpy", "torch")


class VecWorker(CollectsOverlapped, SavesCollections, TimesCollections):
    """Runs an agent on a ParallelEnv and hands back transitions or whole episodes.

    Args:
        penv: the envs. :meth:`shutdown` closes it.
        policy: the agent: a callable from a batch of observations to a batch
            of actions (NumPy arrays or torch tensors), e.g. a ``torch.nn.Module``.
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
            worker's envs) while the agent computes the other half's
            actions (see the module's docstring). The agent is then called
            on half batches and must act on each row alone, as a network
            without batch statistics does; each env then sees the same
            actions, in the same order, as without overlap. It hides the
            envs' waiting behind the agent, at the price of a second send
            and recv per step and of two agent calls on half batches: it
            pays where the envs wait on cores of their own (I/O, a renderer,
            a simulator in another process; a subproc worker per env, or
            Ray) and a half batch costs the agent about half a batch's
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
        self._step_count = 0
        self._settler = Settler(penv, max_episode_length, self._out)
        self._record = EpisodeRecord(n)

    @property
    def max_episode_length(self) -> int | None:
        """Episodes are cut after this many steps, as truncations; None: never."""
        return self._settler.max_episode_length

    @max_episode_length.setter
    def max_episode_length(self, steps: int | None) -> None:
        self._settler.max_episode_length = steps

    def __enter__(self) -> VecWorker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ updates

    def update_agent(self, policy_or_params: Any) -> None:
        """Use a new agent, or load new parameters into the current one (:attr:`policy`).

        Args:
            policy_or_params: a callable replaces the agent; a mapping is
                loaded with the agent's ``load_state_dict`` (a torch module's
                ``state_dict()``); anything else goes to the agent's
                ``set_param_values`` method, where it has one.
        """
        self.policy = updated_agent(self.policy, policy_or_params)

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
        self._settler.new_episodes(self._every)
        self._record.start(self._step_count)

    def step_episode(self) -> bool:
        """Step every env once; True when that completed an episode that :meth:`collect_episode` hands
        over. Not one: an episode already in progress when recording began (after :meth:`collect`),
        or one cut short by an env rebuilt after a failure."""
        self._ensure_started()
        self._record.resume(self._step_count)
        settled = self._step_every_env()
        return self._record.add(settled.step, settled.ended, self._step_count, settled.rebuilt) > 0

    def collect_episode(self) -> EpisodeBatch:
        """The episodes completed by :meth:`step_episode` since the last call (none when none has).

        Raises:
            RuntimeError: no episode is being recorded (nothing has run since the worker was made,
                or :meth:`collect` ran last: it records transitions). An empty batch would then be
                a silent wrong answer, empty however often asked, which a garage-style sampler
                would hand to training as data; garage's own workers hand over the episode a
                rollout ran, so the error says which call runs one.
        """
        if not self._record.recording:
            raise RuntimeError(
                "collect_episode() has no episodes to hand over: none is recorded since "
                + ("the worker was made" if self._obs is None else "collect(), which records transitions")
                + ". Run collect_episodes(n) or rollout(), or step_episode() until it returns True, first"
            )
        completed = self._record.take_completed()
        if not completed:
            return EpisodeBatch.empty(self.penv.single_observation_space, self.penv.single_action_space, self._out)
        return EpisodeBatch.concatenate(completed)

    def rollout(self) -> EpisodeBatch:
        """Start an episode in every env and run until one completes; returns the completed one(s)."""
        self._begin_episodes()
        while not self.step_episode():
            pass
        return self.collect_episode()

    def collect_episodes(self, num_episodes: int) -> EpisodeBatch:
        """Start an episode in every env and step them all until ``num_episodes`` episodes completed;
        returns those, in the order they completed (by env index within a step).

        As for :meth:`rollout`, the first start gives the envs their seeds of
        :attr:`env_seeds` and later ones go on with each env's stream. Episodes
        still in progress when the last one completes, and those completed
        past ``num_episodes`` in that step, are dropped. An episode cut by
        ``max_episode_length`` or by the ``asynchronous=None`` rule counts (it
        ends truncated); one cut short by an env rebuilt after a failure
        (``on_worker_failure`` or ``on_env_error="restart"``) is not complete
        and does not.

        Example:
            >>> import numpy as np
            >>> from parallelenv import ParallelEnv
            >>> from parallelenv.rollout import VecWorker
            >>> penv = ParallelEnv.make("CartPole-v1", num_envs=2, asynchronous="restart")
            >>> with VecWorker(penv, lambda obs: np.zeros(len(obs), np.int64), seed=0) as worker:
            ...     batch = worker.collect_episodes(5)
            >>> len(batch), int(batch.lengths.sum()) == len(batch.rewards)
            (5, True)
        """
        if not isinstance(num_episodes, int) or isinstance(num_episodes, bool) or num_episodes < 1:
            raise ValueError(f"num_episodes={num_episodes!r}; use a positive int")
        self._begin_episodes()
        episodes: list[EpisodeBatch] = []  # one episode each
        while len(episodes) < num_episodes:
            if self.step_episode():
                episodes.extend(self._record.take_completed())
        return EpisodeBatch.concatenate(episodes[:num_episodes])

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
        self._record.stop()
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

    def _begin_episodes(self) -> None:
        """A new recorded episode in every env, the first start seeding them; nothing completed before kept."""
        if self._obs is None:
            self.worker_init()
        else:
            self.start_episode()
        self._record.take_completed()  # episodes of earlier calls are not this call's

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

    def _step_every_env(self) -> Settled:
        """Step every env once with the agent's actions; restart the episodes that ended."""
        obs = self._obs
        action, env_action = self._act(obs, self._every)
        results = self.penv.step(env_action)
        if self.penv.reuses_result_buffers:  # the next step would overwrite the steps kept here
            results = copy_tree(results)
        settled = self._settler.settle(self._every, obs, action, results)
        self._obs = settled.obs
        self._step_count += 1
        return settled

    def _restart_envs(self, ids: np.ndarray, record: bool) -> None:
        """Reset ``ids`` and put their first obs into the current obs."""
        obs, _ = self.penv.reset(id=ids)
        put_rows(self._obs, ids, self._out(obs))
        if not record:  # an env replaced mid-episode: its episode so far is dropped
            self._settler.new_episodes(ids)
            self._record.drop(ids, self._step_count)

    def _act(self, obs: Tree, rows: slice | np.ndarray) -> tuple[Tree, Tree]:
        """The agent's actions for the envs of ``rows`` (every env's slice, or a half's ids): as
        recorded (output format) and as the ParallelEnv takes them."""
        env_device = self._env_device if self._env_is_torch else None
        action, env_action = self._timed_policy(agent_actions, self.policy, obs, np.arange(self.num_envs)[rows],
                                                self.num_envs, self.penv.single_action_space, self._env_is_torch,
                                                env_device)
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


def _progress(steps: Iterable[int], show: bool) -> Iterator[int]:
    if not show:
        return iter(steps)
    try:
        from tqdm.auto import tqdm
    except ImportError as exc:
        raise ImportError(missing_extra("progress=True needs tqdm", "demo")) from exc
    return iter(tqdm(steps, desc="collect", unit="step"))
