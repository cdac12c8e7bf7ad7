"""TensorEnv: many envs of one kind as batched torch tensors on one device.

A subclass writes two methods over the whole batch, in place, with tensor
operations only: :meth:`TensorEnv.reset_envs` starts new episodes in some
rows, :meth:`TensorEnv.step_envs` advances every env by one step.
The base class turns them into a per-id reset (with seeding) and a step of
any subset of envs: it keeps a copy of the per-env state (``state_fields``),
steps the whole batch, and puts the state of the envs not asked for back.
The full batch, the hot path, does none of that.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, ClassVar, Optional

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from parallelenv.arrays import torch_device
from parallelenv.tensor.random import CounterRNG

StepTensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def default_device() -> torch.device:
    """``cuda`` when there is one, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def torch_dtype(space: gym.Space) -> torch.dtype:
    """The torch dtype holding values of ``space`` (its NumPy dtype's twin)."""
    assert space.dtype is not None, space
    return torch.from_numpy(np.zeros(0, dtype=space.dtype)).dtype


Rows = Optional[torch.Tensor]  # noqa: UP045  (a runtime alias: `X | None` of a class needs 3.10 typing)
"""Which envs a reset is for: None (every env), an int64 index tensor, or a boolean mask."""


def put_rows(target: torch.Tensor, rows: Rows, values: torch.Tensor) -> None:
    """``target[rows] = values``, in place, for every kind of ``rows``."""
    if rows is None:
        target.copy_(values)
    elif rows.dtype == torch.bool:
        mask = rows.view(-1, *[1] * (target.dim() - 1))
        if target.is_contiguous():
            torch.where(mask, values, target, out=target)
        else:  # a compiled step takes no strided out= (a column-major state seen as rows)
            target.copy_(torch.where(mask, values, target))
    else:
        target.index_copy_(0, rows, values if values.dtype == target.dtype else values.to(target.dtype))


def fill_rows(target: torch.Tensor, rows: Rows, value: float) -> None:
    """``target[rows] = value``, in place, for every kind of ``rows``."""
    if rows is None:
        target.fill_(value)
    elif rows.dtype == torch.bool:
        target.masked_fill_(rows.view(-1, *[1] * (target.dim() - 1)), value)
    else:
        target.index_fill_(0, rows, value)


def batch_shape(space: gym.Space, num_envs: int) -> tuple[int, ...]:
    if not isinstance(space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        raise TypeError(f"a TensorEnv's spaces must be Box, Discrete, MultiDiscrete or MultiBinary, not {space}")
    assert space.shape is not None, space
    return (num_envs, *space.shape)


class TensorEnv:
    """The base class of batched envs whose state lives in torch tensors.

    Subclasses set ``single_observation_space``, ``single_action_space`` and
    ``state_fields`` (the names of their per-env tensors, first dimension
    ``num_envs``), and implement :meth:`reset_envs` and :meth:`step_envs`.

    Both write their results into the buffers allocated here once:
    ``self.obs``, ``self.reward``, ``self.terminated``, ``self.truncated``.
    These are outputs only, handed to the caller as they are: the env keeps
    its state in tensors of its own, and every step rewrites all four. Both
    may put a Gymnasium vector info (``key`` and its mask ``"_" + key``,
    tensors over every env) into ``self.infos``, which is emptied before each
    call. Random numbers come from ``self.rng``, whose per-env streams make
    an env's trajectory depend on its own seed only.

    Args:
        num_envs: how many envs.
        device: where the tensors live; default ``cuda`` when there is one.

    Example:
        >>> import torch
        >>> from gymnasium import spaces
        >>> class Walk(TensorEnv):
        ...     single_observation_space = spaces.Box(-10.0, 10.0, (1,))
        ...     single_action_space = spaces.Discrete(2)
        ...     state_fields = ("position", "elapsed")
        ...     def __init__(self, num_envs, device="cpu"):
        ...         super().__init__(num_envs, device)
        ...         self.position = torch.zeros(num_envs, 1, device=self.device)
        ...         self.elapsed = torch.zeros(num_envs, dtype=torch.int64, device=self.device)
        ...     def reset_envs(self, rows, options):
        ...         put_rows(self.position, rows, self.rng.uniform((1,), -1.0, 1.0, rows))
        ...         fill_rows(self.elapsed, rows, 0)
        ...         self.obs.copy_(self.position)
        ...     def step_envs(self, actions):
        ...         self.position.add_(actions[:, None] * 2 - 1).clamp_(-10.0, 10.0)
        ...         self.elapsed += 1
        ...         self.obs.copy_(self.position)
        ...         torch.abs(self.position[:, 0], out=self.reward)
        ...         torch.ge(self.reward, 10.0, out=self.terminated)
        ...         torch.ge(self.elapsed, 100, out=self.truncated)
        >>> env = Walk(4)
        >>> obs = env.reset(seed=0)
        >>> obs, reward, terminated, truncated = env.step(torch.ones(4, dtype=torch.int64))
        >>> obs.shape, reward.shape
        (torch.Size([4, 1]), torch.Size([4]))
    """

    single_observation_space: gym.Space
    single_action_space: gym.Space
    state_fields: tuple[str, ...] = ()
    metadata: ClassVar[dict[str, Any]] = {}
    #: Whether the tensor backend's default, ``compile="auto"``, compiles this env's step (on the CPU, from
    #: ``parallelenv.tensor.compiled.AUTO_MIN_ENVS`` envs): set where the compiled step was measured faster.
    compiles_by_default: ClassVar[bool] = False
    #: Inside a compiled step only: values the step leaves for a restart in the same step, which reads
    #: them instead of the tensors they were written to (the compiled step then makes one pass, not
    #: two); the compiled step sets it back to None at its end.
    _stepped: Any = None

    def __init__(self, num_envs: int, device: torch.device | str | None = None) -> None:
        if not isinstance(num_envs, int) or isinstance(num_envs, bool) or num_envs < 1:
            raise ValueError(f"num_envs={num_envs!r}; use a positive int")
        self.num_envs = num_envs
        self.device = default_device() if device is None else torch_device(device)
        self.rng = CounterRNG(num_envs, self.device)
        obs_space, action_space = self.single_observation_space, self.single_action_space
        self.obs = torch.zeros(batch_shape(obs_space, num_envs), dtype=torch_dtype(obs_space), device=self.device)
        self.device = self.obs.device  # "cuda" as tensors name it, "cuda:0": comparisons then hold
        self.actions = torch.zeros(
            batch_shape(action_space, num_envs), dtype=torch_dtype(action_space), device=self.device
        )
        self.reward = torch.zeros(num_envs, dtype=torch.float32, device=self.device)
        self.terminated = torch.zeros(num_envs, dtype=torch.bool, device=self.device)
        self.truncated = torch.zeros(num_envs, dtype=torch.bool, device=self.device)
        self.infos: dict[str, torch.Tensor] = {}
        self.spec: gym.envs.registration.EnvSpec | None = None
        self._everyone = torch.ones(num_envs, dtype=torch.bool, device=self.device)

    # ------------------------------------------------------------ for subclasses

    def reset_envs(self, rows: Rows, options: dict[str, Any] | None) -> None:
        """Start a new episode in the envs of ``rows``; leave the others as they are.

        ``rows`` is None (every env), an index tensor, or a boolean mask over
        every env (where building an index would wait for an accelerator).
        :func:`put_rows`, :func:`fill_rows` and ``self.rng.uniform(..., rows)``
        take all three. Writes the envs' first obs into their rows of
        ``self.obs``; leaves ``reward``, ``terminated`` and ``truncated`` alone
        (a restart happens after the step that filled them, before they are read).
        """
        raise NotImplementedError

    def step_envs(self, actions: torch.Tensor) -> None:
        """Advance every env by one step with ``actions`` (``(num_envs, ...)``), in place.

        Writes ``self.obs``, ``self.reward``, ``self.terminated`` and ``self.truncated``.
        """
        raise NotImplementedError

    # ------------------------------------------------------------ the batched API

    def reset(
        self, ids: torch.Tensor | None = None, seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> torch.Tensor:
        """Start new episodes in the envs of ``ids`` (all when None); returns ``self.obs``.

        Args:
            ids: an int64 index tensor on ``device``, or None for every env.
            seed: None (continue each env's stream); an int, from which env
                ``i`` derives its own stream; or one seed (or None) per env of ``ids``.
            options: passed to :meth:`reset_envs`.
        """
        if seed is not None:
            self.rng.seed(ids, seed)
        self.infos = {}
        self.reset_envs(ids, options)
        return self.obs

    def step(self, actions: torch.Tensor, ids: torch.Tensor | None = None) -> StepTensors:
        """Step the envs of ``ids`` (all when None), one action each; the others keep their state.

        Returns the buffers ``(obs, reward, terminated, truncated)``, every
        env's row; with ``ids`` only those rows are this step's results.
        """
        if ids is None:
            self.infos = {}
            self.step_envs(actions)
        else:
            self.actions[ids] = actions
            self.step_where(self.actions, self.mask(ids))
        return self.obs, self.reward, self.terminated, self.truncated

    def reset_where(self, mask: torch.Tensor, options: dict[str, Any] | None = None) -> None:
        """Start new episodes where ``mask`` is set (``self.infos`` emptied first).

        On the CPU the mask becomes an index, so that only those envs draw
        their start; on an accelerator the mask is used as it is, since an
        index of data-dependent length would wait for the device.
        """
        self.reset_rows(self.where(mask), options)

    def reset_rows(self, rows: Rows, options: dict[str, Any] | None = None) -> None:
        """:meth:`reset_envs` with ``self.infos`` emptied first."""
        self.infos = {}
        self.reset_envs(rows, options)

    def where(self, mask: torch.Tensor) -> Rows:
        """``mask`` as the rows to work on: an index on the CPU, the mask itself on an accelerator."""
        if self.device.type != "cpu":
            return mask
        # NumPy's nonzero over the tensor's own memory: a quarter of torch.nonzero's time at N=4096.
        return torch.from_numpy(np.flatnonzero(mask.numpy()))

    def rows_mask(self, rows: Rows) -> torch.Tensor:
        """The boolean mask over every env of ``rows`` (for the ``_`` masks of ``self.infos``)."""
        if rows is None:
            return self._everyone.clone()
        return rows.clone() if rows.dtype == torch.bool else self.mask(rows)

    def mask(self, ids: torch.Tensor) -> torch.Tensor:
        """The boolean mask over every env of the envs in ``ids``."""
        mask = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        mask[ids] = True
        return mask

    def close(self) -> None:
        """Release what the env holds; tensors go with the object."""

    def step_where(self, actions: torch.Tensor, mask: torch.Tensor) -> None:
        """Step the envs where ``mask`` is set with their rows of ``actions`` (``(num_envs, ...)``).

        The other envs keep their state, obs and random stream: the whole
        batch is stepped and their per-env tensors are put back.
        """
        # Fields are read again after the step: step_envs may rebind them to new tensors.
        names = (*self.state_fields, "obs")
        kept = [getattr(self, name).clone() for name in names]
        counter = self.rng.counter.clone()
        self.infos = {}
        self.step_envs(actions)
        torch.where(mask, self.rng.counter, counter, out=self.rng.counter)
        others = ~mask
        for name, before in zip(names, kept, strict=True):
            put_rows(getattr(self, name), others, before)  # a column-major state too, in a compiled step

    def get_state(self, ids: torch.Tensor) -> list[Any]:
        """The state of each env of ``ids`` (an index tensor): its rows of ``state_fields`` and of its
        random stream (key and counter), on the host, as :class:`~parallelenv.state.EnvState` values."""
        from parallelenv.state.capture import TENSOR, EnvState, class_name

        rows = {name: getattr(self, name).index_select(0, ids).cpu() for name in (*self.state_fields, "obs")}
        rows["rng.key"], rows["rng.counter"] = self.rng.key[ids].cpu(), self.rng.counter[ids].cpu()
        cls = class_name(type(self))
        return [EnvState(TENSOR, cls, pickle.dumps({name: row[i].clone() for name, row in rows.items()}))
                for i in range(len(ids))]

    def set_state(self, ids: torch.Tensor, states: Sequence[Any]) -> list[None]:
        """Put ``states`` (from :meth:`get_state`, one per env of ``ids``) back into those envs' rows;
        a None for each (the tensor backend takes one value per env from every call)."""
        from parallelenv.state.capture import TENSOR, StateError, class_name

        cls = class_name(type(self))
        for state in states:
            if getattr(state, "way", None) != TENSOR or state.env_class != cls:
                raise StateError(f"{state!r} is not the state of an env of this {cls}")
        decoded = [pickle.loads(state.data) for state in states]
        targets = {name: getattr(self, name) for name in (*self.state_fields, "obs")}
        targets["rng.key"], targets["rng.counter"] = self.rng.key, self.rng.counter
        for name, target in targets.items():
            target.index_copy_(0, ids, torch.stack([rows[name] for rows in decoded]).to(target.device))
        return [None] * len(states)
