"""The two shapes of results: batched (``align="item"``) and per env (``align="batch"``).

*None results* (envs the policy has finished) are filled in here, from the
mask the front object passes, without ever calling into those envs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from parallelenv.array_kinds import NumpyArrays, Selection
from parallelenv.arrays import concatenate
from parallelenv.batching import Batched, unbatch
from parallelenv.calls import Failure
from parallelenv.infos import (
    RESTART_KEYS,
    as_kind,
    env_info,
    every_scalar_as_python,
    python_dtypes_as_python,
    vector_info,
)

NONE_RESULT: tuple[Any, ...] = (None, None, True, False, {})

StepArrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # reward, terminated, truncated


@dataclass
class Received:
    """What the replies said of the envs handed over, besides the buffers' rows."""

    infos: dict[int, dict[str, Any]]  # per env, the non-empty infos
    batched_info: dict[str, Any] | None  # a vector info over the envs handed over, from batched hosts
    none_result: Any  # mask over them of None results (None: the policy gives none)
    # Under "restart", with Buffers.ended: mask over them of the envs reset because their episode
    # ended, and a row each with those episodes' last obs (zeros elsewhere); None when none ended.
    ended: np.ndarray | None = None
    ended_state: np.ndarray | None = None
    # For the keys of ``batched_info`` read from info columns, the exact type of their values
    # (see backends.info_columns): what an env's own info gives back.
    info_kinds: Mapping[str, type] | None = None
    # Per env id, the values of keys whose column types differed between hosts, as each env gave them:
    # ``batched_info`` holds them cast to one dtype.
    own_values: Mapping[int, dict[str, Any]] | None = None  # None: no value was cast (nearly every step)


@dataclass
class Outcome:
    """What a call handed over: the envs that answered, what they answered, and the failures of the others.

    A step or reset fills ``results`` (obs, and for a step reward, terminated
    and truncated, in the order of ``answered``) and ``received``; any other
    call fills ``values``, each env's answer.
    """

    answered: Selection
    failures: list[Failure]
    received: Received | None = None
    results: tuple[Any, ...] | None = None
    values: dict[int, Any] = field(default_factory=dict)


def shaped(outcome: Outcome, align: str, with_env_id: bool, arrays: NumpyArrays) -> Any:
    """The results of a step, recv or reset's ``outcome`` as ``align`` shapes them; None where no env
    answered. ``with_env_id``: ``info["env_id"]`` says which envs answered (always beside failures)."""
    if outcome.results is None:
        return None
    obs, *step_arrays = outcome.results
    answered = outcome.answered.ids
    env_ids = answered if with_env_id or outcome.failures else None
    assemble = batch_results if align == "batch" else item_results
    return assemble(obs, tuple(step_arrays) or None, answered, outcome.received, arrays, env_ids=env_ids)


def add_ended(received: Received, ended: np.ndarray | None, ended_obs: Any, selection: Selection) -> None:
    """The episodes that ended in the step of ``selection`` handed over, out of the buffers' rows
    of ended episodes (``Buffers.ended``, ``Buffers.ended_obs``), if any."""
    if ended is None:
        return
    mask = ended[selection.rows]
    if not np.count_nonzero(mask):  # a third of the cost of mask.any() on a few envs
        return
    # Row by row: few episodes end in a step, and NumPy's boolean and fancy
    # indexing cost several times a row's copy on small observations.
    states = np.zeros((len(mask), *ended_obs.shape[1:]), dtype=ended_obs.dtype)
    rows = None if selection.everyone else selection.ids
    for position in mask.nonzero()[0].tolist():
        states[position] = ended_obs[position if rows is None else rows[position]]
    received.ended, received.ended_state = mask.copy(), states


# A batched reply's env ids, vector info, and the types of the keys of it read from info columns.
StoredInfo = tuple[tuple[int, ...], dict[str, Any], Mapping[str, type] | None]


def join_batched_infos(
    stored: list[StoredInfo], selection: Selection, arrays: NumpyArrays
) -> tuple[dict[str, Any] | None, Mapping[str, type] | None, dict[int, dict[str, Any]], list[StoredInfo]]:
    """The vector info of the envs of ``selection`` out of the batched replies ``stored``, the types of
    its keys read from info columns, the values of keys whose types differ between replies as each
    env gave them (by env id: see Received.own_values), and the replies still holding envs of no one
    handed over."""
    if not stored:
        return None, None, {}, stored
    if len(stored) == 1 and stored[0][0] is selection.env_ids:  # a step of every env: the hot path
        return stored[0][1], stored[0][2], {}, []
    wanted = set(selection.env_ids)
    holding = [part for part in stored if wanted.intersection(part[0])]
    kept = [part for part in stored if not wanted.issuperset(part[0])]
    held = {i for env_ids, _, _ in holding for i in env_ids}
    if len(held) < len(wanted):  # envs whose hosts' replies brought no vector info: their keys are unset
        holding.append((tuple(i for i in selection.env_ids if i not in held), {}, None))
    disputed, kinds = _disputed_keys(holding)
    infos = [_with_every_key(info, len(env_ids), holding) for env_ids, info, _ in holding]
    keys = set.intersection(*(set(info) for info in infos)) - disputed - {"_" + key for key in disputed}
    joined = concatenate([{key: info[key] for key in keys} for info in infos])
    own_values: dict[int, dict[str, Any]] = {}
    for key in disputed:
        joined.update(_merged_again(key, holding, own_values))
    position = {env_id: p for p, env_id in enumerate(i for env_ids, _, _ in holding for i in env_ids)}
    order = np.array([position[i] for i in selection.env_ids], dtype=np.int64)
    if (order == np.arange(len(order))).all() and len(order) == len(position):
        return joined, kinds, own_values, kept
    rows = arrays.reply_rows(order)
    return {key: value[rows] for key, value in joined.items()}, kinds, own_values, kept


def _disputed_keys(parts: list[StoredInfo]) -> tuple[set[str], dict[str, type]]:
    """The masked keys whose column types differ between ``parts`` (two hosts learned their info columns
    from different envs), and the types of the others."""
    dtypes: dict[str, Any] = {}
    kinds: dict[str, type] = {}
    disputed = set()
    for _, info, part_kinds in parts:
        for key, value in info.items():
            if "_" + key not in info or not isinstance(value, np.ndarray):
                continue
            kind = (part_kinds or {}).get(key)
            if key in dtypes and (dtypes[key] != value.dtype or kinds.get(key) is not kind):
                disputed.add(key)
            dtypes[key] = value.dtype
            if kind is not None:
                kinds[key] = kind
    return disputed, {key: kind for key, kind in kinds.items() if key not in disputed}


def _merged_again(key: str, parts: list[StoredInfo], own_values: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """``key`` and its mask over the envs of ``parts``, merged from each env's own value in env order;
    those values go into ``own_values`` too, by env id."""
    entries, offset = [], 0
    for env_ids, info, part_kinds in parts:
        if key in info:
            kind = (part_kinds or {}).get(key)
            for local in np.flatnonzero(info["_" + key]).tolist():
                value = info[key][local]
                value = value if kind is None else as_kind(kind, value)
                entries.append((offset + local, {key: value}))
                own_values.setdefault(env_ids[local], {})[key] = value
        offset += len(env_ids)
    merged = vector_info(entries, offset)
    return {key: merged[key], "_" + key: merged["_" + key]}


def _with_every_key(info: dict[str, Any], n: int, stored: list[StoredInfo]) -> dict[str, Any]:
    """``info`` (of ``n`` envs) with the masked NumPy keys that other replies of ``stored`` have and it
    lacks, set for none of its envs: one host's info columns may hold a key that another's envs never set."""
    missing = None
    for _, other, _ in stored:
        for key, value in other.items():
            if key not in info and "_" + key in other and isinstance(value, np.ndarray):
                if missing is None:
                    missing = dict(info)
                missing[key] = np.zeros((n, *value.shape[1:]), dtype=value.dtype)
                missing["_" + key] = np.zeros(n, dtype=bool)
    return info if missing is None else missing


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
        merge_batched(info, received.batched_info, ids, infos, received.info_kinds or {})
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


def merge_batched(info: dict[str, Any], batched: dict[str, Any], ids: np.ndarray,
                  infos: dict[int, dict[str, Any]], kinds: Mapping[str, type]) -> None:
    """Add a vector info of batched hosts or info columns to ``info``, the one merged from the replies'
    per-env infos, as if every env's value had come in its reply.

    A key only one of them has is taken as it is. A key both have (a value
    in its column for some envs, for others one of another type, in the
    reply) is merged again from every env's value in env order, so that its
    dtype is the first env's as in Gymnasium's vector infos.
    """
    if not info:  # no env's reply had an info: the common step
        info.update(batched)
        return
    for key, value in batched.items():
        if key.startswith("_") and key[1:] in batched:
            continue  # a mask, taken with its key
        mask = batched.get("_" + key)
        if key not in info or mask is None:
            info[key] = value
            if mask is not None:
                info["_" + key] = mask
            continue
        entries = {p: {key: each[key]} for p, each in _by_position(ids, infos) if key in each}
        kind = kinds.get(key)
        for p in np.flatnonzero(mask).tolist():
            entries[p] = {key: value[p] if kind is None else as_kind(kind, value[p])}
        merged = vector_info(sorted(entries.items(), key=_first), len(ids))
        info[key], info["_" + key] = merged[key], merged["_" + key]


def own_info(received: Received, position: int, env_id: int) -> dict[str, Any]:
    """The info the env at ``position`` (env ``env_id``) of a step handed over gave itself, each value as
    it gave it, before any merge into a vector info cast it; the ``restart`` policy's additions left out."""
    own = received.own_values.get(env_id, {}) if received.own_values else {}
    info = {**own, **received.infos.get(env_id, {})}
    batched = received.batched_info
    if batched is not None:
        kinds = received.info_kinds or {}
        for key, value in env_info(batched, position, python_dtypes_as_python).items():
            if key not in info:
                info[key] = as_kind(kinds[key], batched[key][position]) if key in kinds else value
    return {key: value for key, value in info.items() if key not in RESTART_KEYS}


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
            for key, kind in (received.info_kinds or {}).items():
                if key in info and key not in received.infos.get(i, ()):
                    info[key] = as_kind(kind, received.batched_info[key][p])
            if received.own_values:
                info.update(received.own_values.get(i, {}))
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
