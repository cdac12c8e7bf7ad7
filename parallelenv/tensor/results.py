"""Step and reset results of the tensor backend: None results, restarts, per-env tuples.

Every function is a masked tensor operation over the rows of a call, so
that a step never waits for the device; only ``align="batch"``, which builds
Python objects per env, reads results back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from parallelenv.results import NONE_RESULT

Info = dict[str, Any]


@dataclass
class StepResult:
    """One call's results, rows in the order of its ids; owned by the caller (copies)."""

    obs: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    info: Info

    def as_item(self) -> tuple[Any, ...]:
        return self.obs, self.reward, self.terminated, self.truncated, self.info


def rows(info: dict[str, torch.Tensor], ids: torch.Tensor | None) -> Info:
    """The rows of ``ids`` of a vector info over every env (copies; all rows when None)."""
    return {key: value.clone() if ids is None else value[ids] for key, value in info.items()}


def add_entry(info: Info, key: str, value: torch.Tensor, mask: torch.Tensor) -> None:
    info[key], info["_" + key] = value, mask


def apply_none_results(result: StepResult, idle: torch.Tensor) -> None:
    """Rows where ``idle`` is set become None results: zeros, terminated, ``info["idle"]``."""
    column = idle.view(-1, *[1] * (result.obs.dim() - 1))
    result.obs.masked_fill_(column, 0)
    result.reward.masked_fill_(idle, 0.0)
    result.terminated.logical_or_(idle)
    result.truncated.logical_and_(~idle)
    add_entry(result.info, "idle", idle, idle.clone())


def concatenate(results: list[StepResult]) -> StepResult:
    """The results of several sends, one after another (the keys every one of them has)."""
    if len(results) == 1:
        return results[0]
    keys = [key for key in results[0].info if all(key in r.info for r in results)]
    return StepResult(
        torch.cat([r.obs for r in results]),
        torch.cat([r.reward for r in results]),
        torch.cat([r.terminated for r in results]),
        torch.cat([r.truncated for r in results]),
        {key: torch.cat([r.info[key] for r in results]) for key in keys},
    )


def _per_env_info(info: Info, position: int) -> Info:
    """One env's entries of a vector info: those its mask sets, scalars as Python values."""
    entry: Info = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get("_" + key)
        if mask is not None and not bool(mask[position]):
            continue
        item = value[position]
        entry[key] = item.item() if isinstance(item, torch.Tensor) and item.dim() == 0 else item
    return entry


def per_env_results(result: StepResult, env_ids: np.ndarray | None) -> list[tuple[Any, ...]]:
    """``align="batch"``: one ``(obs, reward, terminated, truncated, info)`` per env, None results as such."""
    reward, terminated, truncated = (t.tolist() for t in (result.reward, result.terminated, result.truncated))
    idle = result.info["_idle"].tolist() if "_idle" in result.info else [False] * len(reward)
    out: list[tuple[Any, ...]] = []
    for p in range(len(reward)):
        info = _per_env_info(result.info, p)
        info.pop("idle", None)
        if env_ids is not None:
            info["env_id"] = int(env_ids[p])
        if idle[p]:
            out.append(NONE_RESULT[:4] + (info if env_ids is not None else {},))
        else:
            out.append((result.obs[p], reward[p], terminated[p], truncated[p], info))
    return out


def per_env_resets(obs: torch.Tensor, info: Info) -> list[tuple[Any, ...]]:
    return [(obs[p], _per_env_info(info, p)) for p in range(len(obs))]
