"""CartPole-v1 as a batched tensor env: Gymnasium's dynamics, checked step by step against it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from parallelenv.tensor import TensorEnv
from parallelenv.tensor.env import Rows, fill_rows, put_rows


def reset_bounds(options: dict[str, Any] | None, low: float, high: float) -> tuple[float, float]:
    """``options["low"]``/``["high"]`` where given, as Gymnasium's classic-control envs read them."""
    if not options:
        return low, high
    low, high = float(options.get("low", low)), float(options.get("high", high))
    if low > high:
        raise ValueError(f"reset option low={low} is above high={high}")
    return low, high


class CartPole(TensorEnv):
    """Gymnasium's ``CartPole-v1``: euler integration, the same thresholds, reward 1.0 a step.

    Episodes terminate when the cart leaves ``[-2.4, 2.4]`` or the pole leans
    more than 12 degrees, and are truncated after ``max_episode_steps`` (500).
    The state is kept in ``dtype`` (float32: fastest; float64: Gymnasium's own
    precision), as an ``(num_envs, 4)`` tensor laid out like the obs.

    Example:
        >>> import torch
        >>> from parallelenv.envs import CartPole
        >>> env = CartPole(num_envs=3, device="cpu")
        >>> obs = env.reset(seed=0)
        >>> obs, reward, terminated, truncated = env.step(torch.tensor([0, 1, 1]))
        >>> obs.shape, reward.tolist()
        (torch.Size([3, 4]), [1.0, 1.0, 1.0])
    """

    x_threshold = 2.4
    theta_threshold_radians = 12 * 2 * math.pi / 360
    _high = np.array([x_threshold * 2, np.inf, theta_threshold_radians * 2, np.inf], dtype=np.float32)
    single_observation_space = spaces.Box(-_high, _high, dtype=np.float32)
    single_action_space = spaces.Discrete(2)
    compiles_by_default = True  # measured faster compiled (docs/guide/tensor.rst)
    state_fields = ("state", "elapsed")

    def __init__(
        self, num_envs: int, device: torch.device | str | None = None, max_episode_steps: int = 500,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(num_envs, device)
        self.gravity = 9.8
        self.masscart = 1.0
        self.masspole = 0.1
        self.total_mass = self.masspole + self.masscart
        self.length = 0.5  # half the pole's length
        self.polemass_length = self.masspole * self.length
        self.force_mag = 10.0
        self.tau = 0.02
        self.max_episode_steps = max_episode_steps
        self.dtype = dtype
        # Stored column by column, (4, num_envs), and seen as rows: each of x, x_dot, theta and theta_dot is
        # contiguous, which a compiled step needs to run vectorised (a row-major state compiles to a scalar loop).
        self._state_columns = torch.zeros(4, num_envs, dtype=dtype, device=self.device)
        self._columns = self._state_columns.unbind(0)  # views: x, x_dot, theta, theta_dot
        self.state = self._state_columns.t()
        self.elapsed = torch.zeros(num_envs, dtype=torch.int32, device=self.device)
        # Scratch space for the step, allocated once.
        self._scratch = torch.empty(7, num_envs, dtype=dtype, device=self.device).unbind(0)
        self._flag = torch.empty(num_envs, dtype=torch.bool, device=self.device)
        self._constants_of: tuple[float, ...] | None = None
        # Made here: made by a compiled step's first trace, they would make its second call trace again.
        self._constant_tensors: dict[str, torch.Tensor] = self._constants

    def reset_envs(self, rows: Rows, options: dict[str, Any] | None) -> None:
        low, high = reset_bounds(options, -0.05, 0.05)
        start = self.rng.uniform((4,), low, high, rows, dtype=self.dtype)
        fill_rows(self.elapsed, rows, 0)
        if rows is not None and rows.dtype == torch.bool and torch.compiler.is_compiling():
            self._restart_compiled(rows, start)
            return
        put_rows(self.state, rows, start)
        put_rows(self.obs, rows, start)

    def _restart_compiled(self, rows: torch.Tensor, start: torch.Tensor) -> None:
        """The restart of a compiled step, column by column from the step's own values: read back from
        the state tensor, they would be a second pass over it (or the step's math again for each column)."""
        columns = self._stepped if self._stepped is not None else self._state_columns.unbind(0)
        self._stepped = None
        state = torch.stack([torch.where(rows, start[:, i], column) for i, column in enumerate(columns)])
        self._state_columns.copy_(state)
        self.obs.copy_(state.t())

    def step_envs(self, actions: torch.Tensor) -> None:
        if torch.compiler.is_compiling():
            self._step_compiled(actions)
            return
        x, x_dot, theta, theta_dot = self._columns
        force, cos, sin, temp, thetaacc, xacc, spare = self._scratch
        k = self._constants
        # Gymnasium's formulas with their constants folded, one rounding an operation (no alpha=, no
        # addcmul: eager torch fuses those into one FMA, a compiled step does not, and the two must agree):
        # temp = (force + pml theta_dot^2 sin) / total
        torch.mul(actions, k["2 force / total"], out=force).sub_(k["force / total"])
        torch.sin(theta, out=sin)
        torch.cos(theta, out=cos)
        torch.mul(theta_dot, theta_dot, out=temp).mul_(sin).mul_(k["pml / total"]).add_(force)
        # thetaacc = (g sin - cos temp) / (length (4/3 - masspole cos^2 / total))
        torch.mul(cos, cos, out=xacc).mul_(k["-length masspole / total"]).add_(k["4/3 length"])
        torch.mul(sin, k["gravity"], out=thetaacc).sub_(torch.mul(cos, temp, out=spare)).div_(xacc)
        # xacc = temp - pml thetaacc cos / total
        torch.sub(temp, torch.mul(thetaacc, cos, out=xacc).mul_(k["pml / total"]), out=xacc)
        tau = k["tau"]
        x.add_(torch.mul(x_dot, tau, out=spare))
        x_dot.add_(torch.mul(xacc, tau, out=spare))
        theta.add_(torch.mul(theta_dot, tau, out=spare))
        theta_dot.add_(torch.mul(thetaacc, tau, out=spare))
        torch.gt(torch.abs(x, out=cos), k["x_threshold"], out=self.terminated)
        self.terminated.logical_or_(torch.gt(torch.abs(theta, out=sin), k["theta_threshold"], out=self._flag))
        self.elapsed.add_(k["1"])
        torch.ge(self.elapsed, k["max_episode_steps"], out=self.truncated)
        self.reward.fill_(1.0)
        self.obs.copy_(self.state)  # as Gymnasium's returns a float32 copy of its state

    def _step_compiled(self, actions: torch.Tensor) -> None:
        """:meth:`step_envs` as pure operations, the same ones in the same order (the same bits), for a
        compiled step: writes into scratch and column views would each be a pass of their own there."""
        x, x_dot, theta, theta_dot = self._state_columns.unbind(0)  # not the views: one input, not five
        k = self._constants
        force = actions * k["2 force / total"] - k["force / total"]
        sin, cos = torch.sin(theta), torch.cos(theta)
        temp = theta_dot * theta_dot * sin * k["pml / total"] + force
        thetaacc = (sin * k["gravity"] - cos * temp) / (cos * cos * k["-length masspole / total"] + k["4/3 length"])
        xacc = temp - thetaacc * cos * k["pml / total"]
        tau = k["tau"]
        columns = (x + x_dot * tau, x_dot + xacc * tau, theta + theta_dot * tau, theta_dot + thetaacc * tau)
        state = torch.stack(columns)
        self._state_columns.copy_(state)
        self._stepped = columns  # for a restart in the same compiled step (TensorEnv._stepped)
        self.terminated.copy_((columns[0].abs() > k["x_threshold"]) | (columns[2].abs() > k["theta_threshold"]))
        self.elapsed.add_(k["1"])
        self.truncated.copy_(self.elapsed >= k["max_episode_steps"])
        self.reward.fill_(1.0)
        self.obs.copy_(state.t())

    @property
    def _constants(self) -> dict[str, torch.Tensor]:
        """The step's constants as 0-dim tensors: torch converts a Python number at every call."""
        key = (self.gravity, self.masscart, self.masspole, self.length, self.force_mag, self.tau,
               self.max_episode_steps)
        if self._constants_of != key:
            total = self.masspole + self.masscart
            self.total_mass, self.polemass_length = total, self.masspole * self.length
            values = {
                "2 force / total": 2 * self.force_mag / total, "force / total": self.force_mag / total,
                "-length masspole / total": -self.length * self.masspole / total,
                "4/3 length": self.length * 4.0 / 3.0, "gravity": self.gravity, "tau": self.tau,
                "pml / total": self.masspole * self.length / total,
                "x_threshold": self.x_threshold, "theta_threshold": self.theta_threshold_radians,
            }
            self._constant_tensors = {name: torch.tensor(v, dtype=self.dtype) for name, v in values.items()}
            self._constant_tensors["1"] = torch.tensor(1, dtype=torch.int32)
            self._constant_tensors["max_episode_steps"] = torch.tensor(self.max_episode_steps, dtype=torch.int32)
            self._constants_of = key
        return self._constant_tensors
