"""The two shapes of results: batched (``align="item"``) and per env (``align="batch"``).

*None results* (envs the policy has finished) are filled in here, from the
mask the front object passes, without ever calling into those envs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parallelenv.batching import Batched, unbatch, zero_positions
from parallelenv.infos import vector_info

NONE_RESULT: tuple[Any, ...] = (None, None, True, False, {})

StepArrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # reward, terminated, truncated


def item_results(
    obs: Batched,
    step_arrays: StepArrays | None,
    ids: np.ndarray,
    infos: dict[int, dict[str, Any]],
    none_result: np.ndarray | None,
    env_ids: np.ndarray | None = None,
) -> Any:
    """``(obs, info)`` after a reset (no ``step_arrays``), else ``(obs, reward, terminated, truncated, info)``."""
    n = len(ids)
    info = vector_info(_by_position(ids, infos), n) if infos else {}
    if env_ids is not None:
        info["env_id"], info["_env_id"] = env_ids.copy(), np.ones(n, dtype=bool)
    if step_arrays is None:
        return obs, info
    reward, terminated, truncated = step_arrays
    if none_result is not None and none_result.any():
        positions = np.flatnonzero(none_result)
        zero_positions(obs, positions)
        reward[positions] = 0.0
        terminated[positions] = True
        truncated[positions] = False
        info["idle"], info["_idle"] = none_result.copy(), none_result.copy()
    return obs, reward, terminated, truncated, info


def _by_position(ids: np.ndarray, infos: dict[int, dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """``(position in ids, info)`` pairs, in position order (the same for every backend)."""
    if len(infos) * 8 >= len(ids):
        return [(p, infos[i]) for p, i in enumerate(ids.tolist()) if i in infos]
    # Few infos: find each one's position. In a step of every env, env i is at
    # position i, which one comparison confirms; other orders need a lookup table.
    n = len(ids)
    pairs = []
    position_of = None
    for i, info in infos.items():
        if i < n and ids[i] == i:
            pairs.append((i, info))
            continue
        if position_of is None:
            position_of = {env_id: p for p, env_id in enumerate(ids.tolist())}
        if i in position_of:
            pairs.append((position_of[i], info))
    return sorted(pairs, key=_first)


def _first(pair: tuple[int, Any]) -> int:
    return pair[0]


def batch_results(
    obs: Batched,
    step_arrays: StepArrays | None,
    ids: np.ndarray,
    infos: dict[int, dict[str, Any]],
    none_result: np.ndarray | None,
    env_ids: np.ndarray | None = None,
) -> list[tuple[Any, ...]]:
    """Per env ``(obs, info)`` after a reset (no ``step_arrays``), else ``(obs, reward, terminated, truncated, info)``."""
    results: list[tuple[Any, ...]] = []
    for p, i in enumerate(ids.tolist()):
        info = infos.get(i, {})
        if env_ids is not None:
            info = {**info, "env_id": i}
        if step_arrays is None:
            results.append((unbatch(obs, p), info))
        elif none_result is not None and none_result[p]:
            results.append(NONE_RESULT[:4] + (info if env_ids is not None else {},))
        else:
            reward, terminated, truncated = step_arrays
            results.append((unbatch(obs, p), float(reward[p]), bool(terminated[p]), bool(truncated[p]), info))
    return results
