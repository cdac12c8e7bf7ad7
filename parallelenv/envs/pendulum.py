"""Pendulum-v1 as a batched tensor env: Gymnasium's dynamics and cost."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from parallelenv.tensor import TensorEnv
from parallelenv.tensor.env import Rows, fill_rows, put_rows


class Pendulum(TensorEnv):
    """Gymnasium's ``Pendulum-v1``: swing a pendulum up; truncated after ``max_episode_steps`` (200).

    Reset options ``x_init`` and ``y_init`` bound the starting angle and
    angular velocity, as in Gymnasium. ``g`` is gravity.

    Example:
        >>> import torch
        >>> from parallelenv.envs import Pendulum
        >>> env = Pendulum(num_envs=2, device="cpu")
        >>> obs = env.reset(seed=0)
        >>> obs, reward, terminated, truncated = env.step(torch.zeros(2, 1))
        >>> obs.shape, bool((reward <= 0).all())
        (torch.Size([2, 3]), True)
    """

    max_speed = 8.0
    max_torque = 2.0
    single_observation_space = spaces.Box(
        -np.array([1.0, 1.0, max_speed], np.float32), np.array([1.0, 1.0, max_speed], np.float32), dtype=np.float32
    )
    single_action_space = spaces.Box(-max_torque, max_torque, (1,), np.float32)
    compiles_by_default = True  # measured faster compiled (docs/guide/tensor.rst)
    state_fields = ("theta", "theta_dot", "elapsed")

    def __init__(
        self, num_envs: int, device: torch.device | str | None = None, g: float = 10.0,
        max_episode_steps: int = 200, dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(num_envs, device)
        self.g = g
        self.m = 1.0
        self.l = 1.0
        self.dt = 0.05
        self.max_episode_steps = max_episode_steps
        self.dtype = dtype
        self.theta = torch.zeros(num_envs, dtype=dtype, device=self.device)
        self.theta_dot = torch.zeros(num_envs, dtype=dtype, device=self.device)
        self.elapsed = torch.zeros(num_envs, dtype=torch.int32, device=self.device)
        self._scratch = torch.empty(2, num_envs, dtype=dtype, device=self.device)
        self._torque = torch.empty(num_envs, device=self.device)
        self._torque_term = torch.empty(num_envs, device=self.device)
        self._obs_columns = torch.empty(3, num_envs, device=self.device)

    def reset_envs(self, rows: Rows, options: dict[str, Any] | None) -> None:
        options = options or {}
        x_init, y_init = float(options.get("x_init", math.pi)), float(options.get("y_init", 1.0))
        start = self.rng.uniform((2,), -1.0, 1.0, rows, dtype=self.dtype)
        put_rows(self.theta, rows, start[:, 0] * x_init)
        put_rows(self.theta_dot, rows, start[:, 1] * y_init)
        fill_rows(self.elapsed, rows, 0)
        self._observe()

    def step_envs(self, actions: torch.Tensor) -> None:
        if torch.compiler.is_compiling():
            self._step_compiled(actions)
            return
        cost, term = self._scratch.unbind(0)
        # The torque's terms in the action's float32, as Gymnasium's NumPy computes them.
        u = torch.clamp(actions[:, 0], -self.max_torque, self.max_torque, out=self._torque)
        # angle_normalize(theta) ** 2 + 0.1 * theta_dot ** 2 + 0.001 * u ** 2, the angle as
        # theta - 2 pi floor((theta + pi) / (2 pi)): remainder's kernels round differently eager and compiled.
        torch.add(self.theta, math.pi, out=cost).div_(2 * math.pi).floor_().mul_(2 * math.pi)
        torch.sub(self.theta, cost, out=cost).square_()
        cost.add_(torch.square(self.theta_dot, out=term).mul_(0.1))
        cost.add_(torch.square(u, out=self._torque_term).mul_(0.001))
        self.reward.copy_(cost).neg_()
        # theta_dot + (3 g / (2 l) sin(theta) + 3 / (m l^2) u) dt, clipped; then theta + theta_dot dt
        torch.mul(u, 3.0 / (self.m * self.l**2), out=self._torque_term)
        torch.sin(self.theta, out=term).mul_(3 * self.g / (2 * self.l)).add_(self._torque_term)
        self.theta_dot.add_(term.mul_(self.dt)).clamp_(-self.max_speed, self.max_speed)
        self.theta.add_(torch.mul(self.theta_dot, self.dt, out=term))
        self.elapsed += 1
        torch.ge(self.elapsed, self.max_episode_steps, out=self.truncated)
        self._observe()

    def _step_compiled(self, actions: torch.Tensor) -> None:
        """:meth:`step_envs` as pure operations, the same ones in the same order (the same bits), for a
        compiled step: writes into the scratch rows, views of one tensor, would each be a pass there."""
        theta, theta_dot = self.theta, self.theta_dot
        u = torch.clamp(actions[:, 0], -self.max_torque, self.max_torque).to(self._torque.dtype)
        wrapped = theta - ((theta + math.pi) / (2 * math.pi)).floor() * (2 * math.pi)
        cost = wrapped.square() + theta_dot.square() * 0.1 + u.square() * 0.001
        self.reward.copy_(-cost)
        term = torch.sin(theta) * (3 * self.g / (2 * self.l)) + u * (3.0 / (self.m * self.l**2))
        theta_dot = (theta_dot + term * self.dt).clamp(-self.max_speed, self.max_speed)
        theta = theta + theta_dot * self.dt
        self.theta.copy_(theta)
        self.theta_dot.copy_(theta_dot)
        self.elapsed += 1
        self.truncated.copy_(self.elapsed >= self.max_episode_steps)
        self._observe()

    def _observe(self) -> None:
        if torch.compiler.is_compiling():
            self.obs.copy_(torch.stack([torch.cos(self.theta), torch.sin(self.theta), self.theta_dot]).t())
            return
        # Column by column into a contiguous scratch, then one copy: a compiled step takes no strided out=.
        cos, sin, theta_dot = self._obs_columns.unbind(0)
        torch.cos(self.theta, out=cos)
        torch.sin(self.theta, out=sin)
        theta_dot.copy_(self.theta_dot)
        self.obs.copy_(self._obs_columns.t())
