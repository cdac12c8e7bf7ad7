"""Chasing: an agent chases a randomly moving robot, after ElegantRL's GPU VecEnv tutorial."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from parallelenv.tensor import TensorEnv
from parallelenv.tensor.env import Rows, fill_rows, put_rows


class Chasing(TensorEnv):
    """An agent chasing a robot that moves at random in ``dim`` dimensions.

    Each step the robot's velocity decays by half and takes a random push;
    the agent's decays by a quarter and takes the action (scaled down to
    length 1 where longer). The reward is how much closer the agent got,
    less 0.02 times the action's length. An episode terminates when the agent
    is within ``catch_distance`` of the robot and is truncated after
    ``max_episode_steps``. Obs: robot position and velocity, then the agent's.

    Example:
        >>> import torch
        >>> from parallelenv.envs import Chasing
        >>> env = Chasing(num_envs=4, dim=3, device="cpu")
        >>> obs = env.reset(seed=0)
        >>> obs, reward, terminated, truncated = env.step(torch.zeros(4, 3))
        >>> obs.shape
        torch.Size([4, 12])
    """

    compiles_by_default = True  # measured faster compiled (docs/guide/tensor.rst)
    state_fields = ("bodies", "distance", "elapsed")

    def __init__(
        self, num_envs: int, dim: int = 2, device: torch.device | str | None = None,
        max_episode_steps: int = 2**10, init_distance: float = 8.0, catch_distance: float = 1.0,
    ) -> None:
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim={dim!r}; use a positive int")
        self.dim = dim
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (4 * dim,), np.float32)
        self.single_action_space = spaces.Box(-1.0, 1.0, (dim,), np.float32)
        super().__init__(num_envs, device)
        self.max_episode_steps = max_episode_steps
        self.init_distance = init_distance
        self.catch_distance = catch_distance
        # Position and velocity of the robot, then of the agent: the obs, laid out as bodies. Stored column
        # by column and seen as rows: a compiled step runs vectorised over contiguous columns only.
        self._body_columns = torch.zeros(4 * dim, num_envs, device=self.device)
        self.bodies = self._body_columns.t()
        self.robot = self.bodies[:, : 2 * dim].unflatten(1, (2, dim))
        self.agent = self.bodies[:, 2 * dim :].unflatten(1, (2, dim))
        self.distance = torch.zeros(num_envs, device=self.device)
        self.elapsed = torch.zeros(num_envs, dtype=torch.int32, device=self.device)

    def reset_envs(self, rows: Rows, options: dict[str, Any] | None) -> None:
        if rows is not None and rows.dtype == torch.bool and torch.compiler.is_compiling():
            self._restart_compiled(rows)
            return
        # The robot starts near the origin, the agent init_distance away in a random direction.
        draws = self.rng.uniform((2, self.dim), -1.0, 1.0, rows)
        robot, heading = draws[:, 0], draws[:, 1]
        length = _norm(heading)[:, None].clamp_min_(1e-6)
        agent = heading / length * self.init_distance + robot
        start = torch.cat([robot, torch.zeros_like(robot), agent, torch.zeros_like(agent)], dim=1)
        put_rows(self.bodies, rows, start)
        put_rows(self.obs, rows, start)
        put_rows(self.distance, rows, _norm(agent - robot))
        fill_rows(self.elapsed, rows, 0)

    def _restart_compiled(self, rows: torch.Tensor) -> None:
        """:meth:`reset_envs` in a compiled step, column by column, from the step's own values (see CartPole's)."""
        dim = self.dim
        draws = self.rng.uniform_columns(2 * dim, -1.0, 1.0, rows)
        robot, heading = draws[:dim], draws[dim:]
        length = _norm_of_columns(heading).clamp_min(1e-6)
        agent = [h / length * self.init_distance + r for h, r in zip(heading, robot, strict=True)]
        zeros = [torch.zeros_like(length)] * dim
        start = [*robot, *zeros, *agent, *zeros]
        columns = self._stepped if self._stepped is not None else self._body_columns.unbind(0)
        self._stepped = None
        bodies = torch.stack([torch.where(rows, first, column) for first, column in zip(start, columns, strict=True)])
        self._body_columns.copy_(bodies)
        self.obs.copy_(bodies.t())
        put_rows(self.distance, rows, _norm_of_columns([a - r for a, r in zip(agent, robot, strict=True)]))
        fill_rows(self.elapsed, rows, 0)

    def step_envs(self, actions: torch.Tensor) -> None:
        if torch.compiler.is_compiling():
            self._step_compiled(actions)
            return
        push = self._unit_clamped(self.rng.uniform((self.dim,), -1.0, 1.0))[0]
        self._move(self.robot, push, decay=0.5)
        action, action_length = self._unit_clamped(actions)
        self._move(self.agent, action, decay=0.75)
        distance = _norm(self.agent[:, 0] - self.robot[:, 0])
        torch.sub(self.distance, distance, out=self.reward).sub_(action_length * 0.02)
        self.distance.copy_(distance)
        torch.lt(distance, self.catch_distance, out=self.terminated)
        self.elapsed += 1
        torch.ge(self.elapsed, self.max_episode_steps, out=self.truncated)
        self.obs.copy_(self.bodies)

    def _step_compiled(self, actions: torch.Tensor) -> None:
        """:meth:`step_envs` as pure operations on the bodies' columns, the same ones in the same order
        (the same bits), for a compiled step: writes into the views of ``bodies`` would each be a pass there."""
        dim = self.dim
        columns = self._body_columns.unbind(0)
        push = _unit_clamped_columns(self.rng.uniform_columns(dim, -1.0, 1.0))[0]
        action, action_length = _unit_clamped_columns(actions.unbind(1))
        robot_velocity = [v * 0.5 + p for v, p in zip(columns[dim : 2 * dim], push, strict=True)]
        robot = [x + v * 0.01 for x, v in zip(columns[:dim], robot_velocity, strict=True)]
        agent_velocity = [v * 0.75 + a for v, a in zip(columns[3 * dim :], action, strict=True)]
        agent = [x + v * 0.01 for x, v in zip(columns[2 * dim : 3 * dim], agent_velocity, strict=True)]
        columns = (*robot, *robot_velocity, *agent, *agent_velocity)
        bodies = torch.stack(columns)
        distance = _norm_of_columns([a - r for a, r in zip(agent, robot, strict=True)])
        self.reward.copy_(self.distance - distance - action_length * 0.02)
        self.distance.copy_(distance)
        self.terminated.copy_(distance < self.catch_distance)
        self.elapsed += 1
        self.truncated.copy_(self.elapsed >= self.max_episode_steps)
        self._body_columns.copy_(bodies)
        self._stepped = columns  # for a restart in the same compiled step (TensorEnv._stepped)
        self.obs.copy_(bodies.t())

    @staticmethod
    def _unit_clamped(vectors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``vectors`` scaled down to length 1 where longer, and their lengths."""
        length = _norm(vectors)
        return vectors / length.clamp_min(1.0)[:, None], length

    @staticmethod
    def _move(body: torch.Tensor, push: torch.Tensor, decay: float) -> None:
        position, velocity = body.unbind(1)
        velocity.mul_(decay).add_(push)
        position.add_(velocity * 0.01)


def _norm(vectors: torch.Tensor) -> torch.Tensor:
    """The length of each row of ``(n, dim)`` ``vectors``, summed in a fixed order.

    Not ``torch.linalg.vector_norm``: its kernel and a compiled step's reduction round
    differently, and the eager and compiled steps must agree.
    """
    return _norm_of_columns(vectors.unbind(1))


def _norm_of_columns(columns: Sequence[torch.Tensor]) -> torch.Tensor:
    """:func:`_norm` of the vectors whose coordinates are ``columns``."""
    squares = columns[0] * columns[0]
    for column in columns[1:]:
        squares = squares + column * column
    return squares.sqrt()


def _unit_clamped_columns(columns: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``Chasing._unit_clamped`` of the vectors whose coordinates are ``columns``, column by column:
    a compiled step's loop over rows of a row-major tensor runs a row at a time."""
    length = _norm_of_columns(columns)
    scale = length.clamp_min(1.0)
    return [column / scale for column in columns], length
