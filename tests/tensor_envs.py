"""TensorEnv twins of the test envs of ``envs.py``, so the conformance suite runs on ``tensor``.

``make_penv`` on the tensor backend turns the list of CPU envs a test asks
for into one :class:`CountingTwin` whose rows behave like those envs, and
wraps the ParallelEnv in :class:`NumpyView`, which converts results to
NumPy and leaves out info entries that no env set: the tensor backend keeps
such entries (their masks all False) since telling would mean reading the
device. The conversion changes representation only; which env answered
what is the tensor backend's own. test_tensor.py checks the torch API itself.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from envs import CountingEnv, DelayEnv, FailingResetEnv, FaultyEnv

from parallelenv import ParallelEnv
from parallelenv.tensor import TensorEnv, fill_rows, put_rows
from parallelenv.tensor.env import Rows


class CountingTwin(TensorEnv):
    """Rows that behave like CountingEnv, FaultyEnv(how="raise"), FailingResetEnv and MethodEnv."""

    single_observation_space = CountingEnv.observation_space
    single_action_space = CountingEnv.action_space
    state_fields = ("count", "draw", "step_calls", "last_action")

    def __init__(self, envs: list[CountingEnv], device: str = "cpu") -> None:
        super().__init__(len(envs), device)

        def column(values: list[Any], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        self.tag = column([e.tag for e in envs], torch.int64)
        self.episode_length = column([e.episode_length for e in envs], torch.int64)
        self.terminate = column([e.terminate for e in envs], torch.bool)
        self.gravity = column([e.gravity for e in envs], torch.float64)
        self.at_step = column([getattr(e, "at_step", -1) for e in envs], torch.int64)
        self.fail_reset = column([isinstance(e, FailingResetEnv) for e in envs], torch.bool)
        self.bumps = column([0] * len(envs), torch.int64)
        self.count = column([0] * len(envs), torch.int64)
        self.draw = column([0.0] * len(envs), torch.float64)
        self.step_calls = column([0] * len(envs), torch.int64)
        self.last_action = column([-1.0] * len(envs), torch.float64)

    def reset_envs(self, rows: Rows, options: dict[str, Any] | None) -> None:
        failing = self.rows_mask(rows) & self.fail_reset
        if failing.any():  # a test env may read the device: it checks what the backend reports
            _raise_at(ValueError(f"env {_first(self.tag, failing)} cannot reset"), failing)
        fill_rows(self.count, rows, (options or {}).get("start", 0))
        fill_rows(self.last_action, rows, -1.0)
        put_rows(self.draw, rows, self.rng.uniform((1,), 0.0, 1.0, rows, dtype=torch.float64)[:, 0])
        self._observe()
        self.infos = {"seed_draw": self.draw.clone(), "_seed_draw": self.rows_mask(rows)}

    def step_envs(self, actions: torch.Tensor) -> None:
        faulty = self.step_calls + 1 == self.at_step
        if faulty.any():
            try:
                _Fault(_first(self.tag, faulty)).step()
            except RuntimeError as exc:
                _raise_at(exc, faulty)
        self.step_calls += 1
        self.count += 1
        self.last_action.copy_(actions)
        done = self.count >= self.episode_length
        torch.logical_and(done, self.terminate, out=self.terminated)
        torch.logical_and(done, ~self.terminate, out=self.truncated)
        self.reward.copy_(self.tag * 10 + self.count)
        self._observe()
        self.infos = {"count": self.count.clone(), "_count": self.count % 2 == 0}

    def _observe(self) -> None:
        torch.stack([self.tag.double(), self.count.double(), self.last_action, self.draw], dim=1, out=self.obs)

    def double(self, ids: torch.Tensor, data: list[float]) -> list[float]:
        return [2 * x for x in data]

    def describe(self, ids: torch.Tensor) -> list[str]:
        return [f"env {tag}" for tag in self.tag[ids].tolist()]

    def echo(self, ids: torch.Tensor, x: list[Any], y: list[Any] | None = None) -> list[tuple[int, Any, Any]]:
        """CountingEnv.echo: each keyword comes batched, one value per env of ``ids``."""
        ys = [None] * len(x) if y is None else y
        return list(zip(self.tag[ids].tolist(), x, ys, strict=True))

    def divide(self, ids: torch.Tensor, data: list[float]) -> list[float]:
        def one_over(x: float) -> float:
            return 1 / x

        values = []
        for env_index, x in zip(ids.tolist(), data, strict=True):
            try:
                values.append(one_over(x))
            except ZeroDivisionError as exc:
                exc.env_index = env_index  # type: ignore[attr-defined]  # names the env at fault
                raise
        return values

    def bump(self, ids: torch.Tensor, data: list[int]) -> list[int]:
        self.bumps[ids] += torch.tensor(data, device=self.device)
        return self.bumps[ids].tolist()


class _Fault:
    """FaultyEnv's failure, raised by the same line of code."""

    def __init__(self, tag: int) -> None:
        self.tag = tag

    def step(self) -> None:
        raise RuntimeError(f"env {self.tag} broke on purpose")


def _first(values: torch.Tensor, mask: torch.Tensor) -> int:
    return int(values[mask][0])


def _raise_at(exc: Exception, mask: torch.Tensor) -> None:
    exc.env_index = int(torch.nonzero(mask)[0])  # type: ignore[attr-defined]  # names the env at fault
    raise exc


TWINNED = (CountingEnv, DelayEnv, FailingResetEnv)


def twin(sources: list[Any]) -> CountingTwin:
    """One CountingTwin for a list of CountingEnv-like envs or factories; skips the test otherwise."""
    envs = [source if isinstance(source, gym.Env) else source() for source in sources]
    for env in envs:
        supported = type(env) in TWINNED or type(env).__name__ == "MethodEnv"
        if isinstance(env, FaultyEnv):
            supported = env.how == "raise"
        if not supported:
            pytest.skip(f"{type(env).__name__} has no TensorEnv twin: the tensor backend runs one batched env")
    return CountingTwin(envs)


def to_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        # A copy: a step of every env hands over buffers that the next step rewrites.
        return value.item() if value.dim() == 0 else value.cpu().numpy().copy()
    return value


def _info(info: dict[str, Any]) -> dict[str, Any]:
    """Entries some env set, as NumPy: what the CPU backends report."""
    kept = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = to_numpy(info.get("_" + key))
        if mask is None or np.asarray(mask).any():
            kept[key], kept["_" + key] = to_numpy(value), mask
    return kept


class NumpyView:
    """A tensor ParallelEnv seen as the conformance suite reads results: NumPy arrays."""

    def __init__(self, penv: ParallelEnv) -> None:
        self.penv = penv

    def __len__(self) -> int:
        return len(self.penv)

    def __repr__(self) -> str:
        return repr(self.penv)

    def __enter__(self) -> NumpyView:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        # Spaces, num_envs and the calls whose results hold no tensors pass through.
        return getattr(self.penv, name)

    def reset(self, *args: Any, align: str = "item", **kwargs: Any) -> Any:
        return self._results(self.penv.reset(*args, align=align, **kwargs), align)

    def step(self, *args: Any, align: str = "item", **kwargs: Any) -> Any:
        return self._results(self.penv.step(*args, align=align, **kwargs), align)

    def recv(self, *args: Any, align: str = "item", **kwargs: Any) -> Any:
        return self._results(self.penv.recv(*args, align=align, **kwargs), align)

    def get_env_attr(self, *args: Any, **kwargs: Any) -> list[Any]:
        return [to_numpy(value) for value in self.penv.get_env_attr(*args, **kwargs)]

    def _results(self, results: Any, align: str) -> Any:
        if align == "batch":
            return [tuple(_info(x) if isinstance(x, dict) else to_numpy(x) for x in r) for r in results]
        *arrays, info = results
        return (*(to_numpy(a) for a in arrays), _info(info))


# Tests of the CPU backends' suite that do not apply to one batched env, and why.
ONE_CALL = "the batched env runs the call once for every env: one env's exception is the batch's"
NOT_FOR_TENSOR = {
    "test_spaces_follow_gymnasium_batching": "Dict/Tuple observations: a TensorEnv's spaces are Box/Discrete",
    "test_dict_and_tuple_observations": "Dict/Tuple observations: a TensorEnv's spaces are Box/Discrete",
    "test_dict_env_trajectories_equal_the_dummy_backend": "Dict/Tuple observations",
    "test_bad_box_actions_are_refused_before_sending": "its env has Dict observations (tensor action shapes: "
                                                       "test_tensor.py)",
    "test_restart_reports_the_info_of_its_reset": "the batched twin's reset sets no info",
    "test_cartpole_matches_gymnasium_bit_for_bit": "a TensorEnv draws from its own counter-based streams, not "
                                                   "Gymnasium's; test_tensor.py checks CartPole step by step",
    "test_attrs_reach_through_gymnasium_wrappers": "the tensor CartPole's physics constants are shared by the batch",
    "test_factory_raising_gives_env_error_for_make": "a TensorEnv is built by the caller: no factories run",
    "test_factory_returning_a_non_env_gives_env_error_for_make": "a TensorEnv is built by the caller",
    "test_unpicklable_env_is_refused_by_subproc_and_runs_in_dummy": "nothing crosses a process",
    "test_mixed_action_spaces_name_the_env": "one TensorEnv has one pair of spaces",
    "test_env_warnings_are_silenced_by_default": "the batched env's code runs as the caller's own: no_warning "
                                                 "does not apply",
    "test_get_env_attr_of_a_missing_attribute_is_none_in_that_slot": "an attribute that is not a per-env tensor is "
                                                                     "shared by the batch (test_tensor.py)",
    "test_dropping_the_last_reference_closes": "it builds a list of CPU envs itself (tensor: test_tensor.py)",
    "test_get_env_attr_raising_gives_env_error": "a batched attribute is read once: the error names the first env "
                                                 "of id (test_tensor.py)",
    # One batched env runs a step, reset or method as one call: an exception
    # raised in it is the whole batch's, so there are no other envs' results to keep.
    "test_an_env_raising_in_step_leaves_every_other_env_stepped_and_its_results_on_the_error": ONE_CALL,
    "test_envs_raising_together_are_all_named_and_batch_results_carry_the_rest": ONE_CALL,
    "test_recv_raises_with_the_results_of_the_envs_that_answered": ONE_CALL,
}
