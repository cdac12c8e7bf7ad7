"""A step's infos as one value, from the replies that bring them to the caller that reads them.

An env's info reaches the caller by one of three roads: in its reply as a
dict (rare keys, strings, nested dicts, anything of a new type), in a vector
info over a reply's envs (a batched host: a tensor env, a Ray actor's info
columns), or in the info columns of the shared buffers (numbers and
fixed-shape arrays: :mod:`parallelenv.infos.columns`). :class:`PendingInfos`
gathers what the replies of READY envs brought, by road, until they are
handed over; :meth:`PendingInfos.take` then gives one :class:`StepInfo` over
the envs handed over, whatever roads their values took. A :class:`StepInfo`
is read three ways, the same on every backend:

- :meth:`StepInfo.vector`: Gymnasium's vector info (``align="item"``);
- :meth:`StepInfo.env_info`: one env's info, each value with the type, shape
  and dtype the env gave it (``align="batch"``, the Gymnasium view's
  ``final_info``, the VecWorker's and the pool's per-env infos);
- the keys the ``restart`` policy adds are left to the caller (results.py).

Where the roads disagree on a key's dtype (two hosts learned their columns
from different envs), the vector info is merged again from each env's own
value in env order, as Gymnasium would have merged it, and each env's own
value is kept (``own``) so that :meth:`StepInfo.env_info` stays exact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from parallelenv.arrays import concatenate
from parallelenv.infos.keys import RESTART_KEYS
from parallelenv.infos.vector import as_kind, env_info, every_scalar_as_python, vector_info

if TYPE_CHECKING:
    from parallelenv.array_kinds import NumpyArrays, Selection
    from parallelenv.calls import Reply
    from parallelenv.infos.columns import InfoColumns

__all__ = ["PendingInfos", "StepInfo"]

# A batched reply's env ids, its vector info, and the exact types of the keys of it read from info columns.
VectorPart = tuple[tuple[int, ...], dict[str, Any], Mapping[str, type] | None]


class StepInfo:
    """The infos of the envs of one step, call or reset handed over, in the order they were handed over.

    ``per_env``: by env id, the non-empty infos that travelled as dicts.
    ``batched``: a vector info over the envs (None: none came as one).
    ``kinds``: for its keys read from info columns, the exact type their values had.
    ``own``: by env id, values that ``batched`` holds cast to another dtype, as each env gave them.
    """

    __slots__ = ("per_env", "batched", "kinds", "own")

    def __init__(self, per_env: dict[int, dict[str, Any]], batched: dict[str, Any] | None = None,
                 kinds: Mapping[str, type] | None = None, own: Mapping[int, dict[str, Any]] | None = None) -> None:
        self.per_env = per_env
        self.batched = batched
        self.kinds = kinds
        self.own = own

    def vector(self, ids: np.ndarray) -> dict[str, Any]:
        """Gymnasium's vector info of the envs ``ids`` (this info's envs, in its order): a new dict."""
        per_env = self.per_env
        info = vector_info(_by_position(ids, per_env), len(ids)) if per_env else {}
        if self.batched is not None:
            self._merge_batched(info, ids)
        return info

    def _merge_batched(self, info: dict[str, Any], ids: np.ndarray) -> None:
        """Add the batched vector info to ``info``, the one merged from the per-env dicts, as if every
        env's value had come as a dict: a key both have is merged again from every env's value in env
        order, so that its dtype is the first env's, as in Gymnasium's vector infos."""
        batched = self.batched
        assert batched is not None
        if not info:  # no env's info came as a dict: the common step
            info.update(batched)
            return
        kinds = self.kinds or {}
        for key, value in batched.items():
            if key.startswith("_") and key[1:] in batched:
                continue  # a mask, taken with its key
            mask = batched.get("_" + key)
            if key not in info or mask is None:
                info[key] = value
                if mask is not None:
                    info["_" + key] = mask
                continue
            entries = {p: {key: each[key]} for p, each in _by_position(ids, self.per_env) if key in each}
            kind, own = kinds.get(key), self.own or {}
            for p in np.flatnonzero(mask).tolist():
                env_own = own.get(int(ids[p])) if own else None
                if env_own is not None and key in env_own:  # a value the join cast: as the env gave it
                    entries[p] = {key: env_own[key]}
                else:
                    entries[p] = {key: value[p] if kind is None else as_kind(kind, value[p])}
            merged = vector_info(sorted(entries.items(), key=_first), len(ids))
            info[key], info["_" + key] = merged[key], merged["_" + key]

    def env_info(self, position: int, env_id: int,
                 scalars: Callable[[Any], Any] = every_scalar_as_python) -> dict[str, Any]:
        """The info env ``env_id`` (at ``position``) gave, each value as it gave it: a new dict.

        ``scalars`` says what a 0-d value of a batched vector info that kept
        no exact type becomes (a tensor env's rows: see infos.vector).
        """
        own = self.per_env.get(env_id)
        info = dict(own) if own else {}
        batched = self.batched
        if batched is not None:
            kinds = self.kinds or {}
            for key, value in env_info(batched, position, scalars).items():
                info[key] = as_kind(kinds[key], batched[key][position]) if key in kinds else value
            if self.own:
                info.update(self.own.get(env_id, ()))
        return info

    def env_step_info(self, position: int, env_id: int, scalars: Callable[[Any], Any]) -> dict[str, Any]:
        """:meth:`env_info` without what the ``restart`` policy added to it."""
        return {key: value for key, value in self.env_info(position, env_id, scalars).items()
                if key not in RESTART_KEYS}


NO_INFO = StepInfo({})


class PendingInfos:
    """What the replies of READY envs said in their infos, by road, until the envs are handed over.

    ``columns``: the backend's info columns (None where it has none), whose
    rows of an env hold that env's last step's values until it is handed
    over, since nothing steps a READY env.
    """

    def __init__(self, columns: InfoColumns | None, arrays: NumpyArrays) -> None:
        self._columns = columns
        self._arrays = arrays
        self._per_env: dict[int, dict[str, Any]] = {}
        self._parts: list[VectorPart] = []
        # Whether take() may find anything: a reply brought infos since, or info columns are laid out (a
        # reply with infos lays them out, and is added: so checked again as each take ends).
        self.holds_any = False
        # The one reply added while nothing else was held (most steps: one reply of every env), kept as
        # it came until a second one or a take() of other envs needs it filed by road.
        self._lone: Reply | None = None

    def add(self, reply: Reply) -> None:
        """A step reply's infos: its per-env dicts and its vector info."""
        if not self.holds_any:
            self._lone = reply
            self.holds_any = True
            return
        self._file_lone()
        self._file(reply)

    def _file(self, reply: Reply) -> None:
        if reply.values:
            self._per_env.update(reply.values)
        if reply.info is not None:
            self._parts.append((reply.env_ids, reply.info, reply.info_kinds))

    def _file_lone(self) -> None:
        if self._lone is not None:
            self._file(self._lone)
            self._lone = None

    def forget(self, env_ids: Any) -> None:
        """These envs' rows of the info columns say nothing of the answer handed over next: it is not a
        step their worker wrote (a None result, a rebuilt env's first obs)."""
        if self._columns is not None and self._columns.columns:
            self._columns.forget(env_ids)

    def take(self, selection: Selection) -> StepInfo:
        """The infos of the READY envs of ``selection``, handed over now: they are forgotten here."""
        lone = self._lone
        if lone is not None:
            if lone.env_ids is selection.env_ids and (self._columns is None or not self._columns.columns):
                self._lone, self.holds_any = None, False
                return StepInfo(lone.values, lone.info, lone.info_kinds)
            self._file_lone()
        if selection.everyone:
            per_env, self._per_env = self._per_env, {}
        elif self._per_env:
            per_env = {i: self._per_env.pop(i) for i in selection.env_ids if i in self._per_env}
        else:
            per_env = {}
        batched, kinds, own = self._join_parts(selection)
        batched, kinds = self._with_columns(batched, kinds, selection)
        self.holds_any = bool(self._per_env or self._parts or (self._columns is not None and self._columns.columns))
        return StepInfo(per_env, batched, kinds, own or None)

    def _with_columns(self, batched: dict[str, Any] | None, kinds: Mapping[str, type] | None,
                      selection: Selection) -> tuple[dict[str, Any] | None, Mapping[str, type] | None]:
        """``batched`` with the info columns' keys of the envs of ``selection`` added."""
        columns = self._columns
        if columns is not None and columns.columns:
            in_columns = columns.vector(self._arrays.rows(selection))
            if in_columns:
                return (in_columns if batched is None else {**batched, **in_columns}), columns.kinds
        return batched, kinds

    def _join_parts(self, selection: Selection
                    ) -> tuple[dict[str, Any] | None, Mapping[str, type] | None, dict[int, dict[str, Any]]]:
        """The vector info of the envs of ``selection`` out of the batched replies, the types of its keys
        read from info columns, and the values of keys whose types differ between replies as each env
        gave them; the replies still holding envs of no one handed over are kept."""
        stored = self._parts
        if not stored:
            return None, None, {}
        if len(stored) == 1 and stored[0][0] is selection.env_ids:  # a step of every env: the hot path
            self._parts = []
            return stored[0][1], stored[0][2], {}
        wanted = set(selection.env_ids)
        holding = [part for part in stored if wanted.intersection(part[0])]
        self._parts = [part for part in stored if not wanted.issuperset(part[0])]
        if not holding:
            return None, None, {}
        held = {i for env_ids, _, _ in holding for i in env_ids}
        if len(held) < len(wanted):  # envs whose hosts' replies brought no vector info: their keys are unset
            holding.append((tuple(i for i in selection.env_ids if i not in held), {}, None))
        disputed, kinds = _disputed_keys(holding)
        infos = [_with_every_key(info, len(env_ids), holding) for env_ids, info, _ in holding]
        keys = set.intersection(*(set(info) for info in infos)) - disputed - {"_" + key for key in disputed}
        joined = concatenate([{key: info[key] for key in keys} for info in infos])
        own: dict[int, dict[str, Any]] = {}
        for key in disputed:
            joined.update(_merged_again(key, holding, own))
        position = {env_id: p for p, env_id in enumerate(i for env_ids, _, _ in holding for i in env_ids)}
        order = np.array([position[i] for i in selection.env_ids], dtype=np.int64)
        if (order == np.arange(len(order))).all() and len(order) == len(position):
            return joined, kinds, own
        rows = self._arrays.reply_rows(order)
        return {key: value[rows] for key, value in joined.items()}, kinds, own


def _disputed_keys(parts: list[VectorPart]) -> tuple[set[str], dict[str, type]]:
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


def _merged_again(key: str, parts: list[VectorPart], own: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """``key`` and its mask over the envs of ``parts``, merged from each env's own value in env order;
    those values go into ``own`` too, by env id."""
    entries, offset = [], 0
    for env_ids, info, part_kinds in parts:
        if key in info:
            kind = (part_kinds or {}).get(key)
            for local in np.flatnonzero(info["_" + key]).tolist():
                value = info[key][local]
                value = value if kind is None else as_kind(kind, value)
                entries.append((offset + local, {key: value}))
                own.setdefault(env_ids[local], {})[key] = value
        offset += len(env_ids)
    merged = vector_info(entries, offset)
    return {key: merged[key], "_" + key: merged["_" + key]}


def _with_every_key(info: dict[str, Any], n: int, stored: list[VectorPart]) -> dict[str, Any]:
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
