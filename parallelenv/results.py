"""The two shapes of results: batched (``align="item"``) and per env (``align="batch"``).

*None results* (envs the policy has finished) are filled in here, from the
mask the front object passes, without ever calling into those envs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from parallelenv.array_kinds import NumpyArrays
from parallelenv.batching import Batched, unbatch
from parallelenv.inflight import Received
from parallelenv.infos import env_info, every_scalar_as_python, vector_info

NONE_RESULT: tuple[Any, ...] = (None, None, True, False, {})

StepArrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # reward, terminated, truncated


def item_results(
    obs: Batched,
    step_arrays: StepArrays | None,
    ids: np.ndarray,
    received: Received,
    arrays: NumpyArrays,
    env_ids: np.ndarray | None = None,
) -> Any:
    """``(obs, info)`` after a reset (no ``step_arrays``), else ``(obs, reward, terminated, truncated, info)``."""
    n = len(ids)
    infos = received.infos
    info = vector_info(_by_position(ids, infos), n) if infos else {}
    if received.batched_info is not None:
        info.update(received.batched_info)
    if received.ended is not None:
        ended = received.ended
        info["ended_state"], info["_ended_state"] = received.ended_state, ended
        info["reset"], info["_reset"] = ended.copy(), ended.copy()
    if env_ids is not None:
        info["env_id"], info["_env_id"] = env_ids.copy(), np.ones(n, dtype=bool)
    if step_arrays is None:
        return obs, info
    if received.none_result is not None:
        arrays.fill_none_results(obs, step_arrays, info, received.none_result)
    return (obs, *step_arrays, info)


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
    received: Received,
    arrays: NumpyArrays,
    env_ids: np.ndarray | None = None,
) -> list[tuple[Any, ...]]:
    """Per env ``(obs, info)`` after a reset (no ``step_arrays``), else ``(obs, reward, terminated, truncated, info)``."""
    results: list[tuple[Any, ...]] = []
    if step_arrays is not None:
        reward, terminated, truncated = (arrays.to_list(a) for a in step_arrays)
    none_result = [False] * len(ids) if received.none_result is None else arrays.to_list(received.none_result)
    ended = [False] * len(ids) if received.ended is None else received.ended.tolist()
    for p, i in enumerate(ids.tolist()):
        info = received.infos.get(i, {})
        if received.batched_info is not None:
            info = {**info, **env_info(received.batched_info, p, every_scalar_as_python)}
        if ended[p]:
            info = {**info, "ended_state": received.ended_state[p], "reset": True}
        if env_ids is not None:
            info = {**info, "env_id": i}
        if step_arrays is None:
            results.append((unbatch(obs, p), info))
        elif none_result[p]:
            results.append(NONE_RESULT[:4] + (info if env_ids is not None else {},))
        else:
            results.append((unbatch(obs, p), reward[p], terminated[p], truncated[p], info))
    return results
