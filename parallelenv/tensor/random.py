"""Counter-based random numbers, one independent stream per env.

A draw of env ``i`` is a hash of its key (from its seed) and its counter (how
many draws it made), so what env ``i`` sees depends on its own seed and
history only: not on which other envs were reset, seeded or stepped with it.
Every draw is computed for all envs at once, and a mask says whose counter
advances, so nothing depends on data the host would have to read back.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import numpy as np
import torch

_MASK32 = 0xFFFFFFFF
# Odd constants of the murmur3 finalizer and the golden ratio, as signed int32.
_M1 = 0x85EBCA6B - 2**32
_M2 = 0xC2B2AE35 - 2**32
_GOLDEN = 0x9E3779B9 - 2**32
_TO_UNIT = 2.0**-24


def _wrap(value: int) -> int:
    """``value`` modulo 2**32, as a signed int32."""
    value &= _MASK32
    return value - 2**32 if value >= 2**31 else value


def _int32(value: int) -> torch.Tensor:
    # A 0-dim int32 operand costs less than a Python int, which torch converts at every call.
    return torch.tensor(value, dtype=torch.int32)


# (shift, mask of the bits left after it, multiplier) of each round of the finalizer.
_ROUNDS = [(_int32(shift), _int32((1 << (32 - shift)) - 1), None if m is None else _int32(m))
           for shift, m in ((16, _M1), (13, _M2), (16, None))]
_SHIFT_8, _MASK_24 = _int32(8), _int32(0xFFFFFF)
_M1_NP, _SHIFT_8_NP, _ONE_NP = np.uint32(_M1 & _MASK32), np.uint32(8), np.uint32(1)
_ROUNDS_NP = [(np.uint32(shift), None if m is None else np.uint32(m & _MASK32))
              for shift, m in ((16, _M1), (13, _M2), (16, None))]
_NUMPY_DTYPES: dict[torch.dtype, np.dtype] = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}
_LANES_NP = (np.arange(1, 65, dtype=np.uint64) * (_M2 & _MASK32) & _MASK32).astype(np.uint32)


def _mix(h: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """murmur3's 32-bit finalizer, in place on an int32 tensor (multiplication wraps)."""
    t = torch.empty_like(h) if scratch is None else scratch
    # `>>` is arithmetic on signed ints: the mask makes it the logical shift of uint32.
    for shift, mask, multiplier in _ROUNDS:
        torch.bitwise_right_shift(h, shift, out=t).bitwise_and_(mask)
        h.bitwise_xor_(t)
        if multiplier is not None:
            h.mul_(multiplier)
    return h


def _halves(seed: int) -> tuple[int, int]:
    """Fold a non-negative int of any size into two 32-bit halves."""
    lo = hi = 0
    while True:
        lo ^= seed & _MASK32
        hi ^= (seed >> 32) & _MASK32
        seed >>= 64
        if not seed:
            return lo, hi


class CounterRNG:
    """Per-env random streams: ``key`` from the env's seed, ``counter`` its draws so far.

    Example:
        >>> import torch
        >>> rng = CounterRNG(3, torch.device("cpu"))
        >>> rng.seed(None, [7, 7, 8])
        >>> u = rng.uniform((2,), -1.0, 1.0)
        >>> bool((u[0] == u[1]).all()), bool((u[0] == u[2]).all())
        (True, False)
    """

    def __init__(self, num_envs: int, device: torch.device) -> None:
        self.num_envs = num_envs
        self.device = device
        self.key = torch.empty(num_envs, dtype=torch.int32, device=device)
        self.counter = torch.zeros(num_envs, dtype=torch.int32, device=device)
        self._scratch: dict[tuple[int, torch.dtype], tuple[torch.Tensor, ...]] = {}
        self._ones = torch.ones(num_envs, dtype=torch.int32, device=device)
        self._lanes: list[torch.Tensor] = []
        #: Draw with NumPy over the tensors' memory (CPU only): the same bits, for less per call.
        self.numpy_math = device.type == "cpu"
        # Unseeded envs get streams from the OS's entropy, as Gymnasium's do.
        self.seed(None, secrets.randbits(63))

    def seed(self, ids: torch.Tensor | None, seeds: int | Sequence[int | None]) -> None:
        """Restart the streams of the envs of ``ids`` (all when None).

        ``seeds`` is one base seed, from which env ``i`` derives its own key
        from ``(seed, i)``, or one seed per env of ``ids`` (None: keep its stream).
        """
        if isinstance(seeds, int):
            lo, hi = _halves(seeds)
            index = np.arange(self.num_envs, dtype=np.int64)
            keys = self._keys(np.full(self.num_envs, lo), np.full(self.num_envs, hi), index)
            chosen = None if ids is None else self._mask(ids)
        else:
            halves = np.array([_halves(s or 0) for s in seeds], dtype=np.int64).reshape(-1, 2)
            # An explicit seed owns its stream alone: the env index stays out of its key.
            keys = self._keys(halves[:, 0], halves[:, 1], np.zeros(len(halves), dtype=np.int64))
            keep = torch.tensor([s is None for s in seeds], device=self.device)
            if ids is not None:
                keys, keep = self._spread(keys, ids), self._spread(keep, ids) | ~self._mask(ids)
            chosen = ~keep
        if chosen is None:
            self.key.copy_(keys)
            self.counter.zero_()
        else:
            torch.where(chosen, keys, self.key, out=self.key)
            self.counter.masked_fill_(chosen, 0)

    def _mask(self, ids: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        mask[ids] = True
        return mask

    def _keys(self, lo: np.ndarray, hi: np.ndarray, index: np.ndarray) -> torch.Tensor:
        """Mix a seed's halves and the env index into a 32-bit key (with NumPy: seeding is rare)."""

        def mixed(values: np.ndarray) -> np.ndarray:
            h = (values & _MASK32).astype(np.uint32)
            for shift, multiplier in ((16, _M1), (13, _M2), (16, None)):
                h ^= h >> np.uint32(shift)
                if multiplier is not None:
                    h *= np.uint32(multiplier & _MASK32)
            return h

        golden, m1 = np.uint32(_GOLDEN & _MASK32), np.uint32(_M1 & _MASK32)
        h = mixed(lo.astype(np.uint32) + mixed(hi.astype(np.uint32) + golden))
        keys = mixed(h ^ mixed(index.astype(np.uint32) + m1))
        return torch.from_numpy(keys.view(np.int32)).to(self.device)

    def _spread(self, per_id: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Values given for ``ids``, in their order, placed at their envs in a full-size tensor."""
        full = torch.zeros(self.num_envs, dtype=per_id.dtype, device=self.device)
        full[ids] = per_id
        return full

    def uniform(
        self, shape: tuple[int, ...], low: float, high: float, rows: torch.Tensor | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """Uniform draws in ``[low, high)`` for the envs of ``rows``, whose counters advance.

        ``rows`` is None (every env), an index tensor (draws for those envs,
        in its order) or a boolean mask (draws for every env, counters
        advancing only where it is set). The result, ``(len, *shape)``, is a
        view of a buffer that the next draw of the same size overwrites.
        """
        size = math.prod(shape)
        if torch.compiler.is_compiling():
            return self._uniform_traced(size, shape, low, high, rows, dtype)
        if self.numpy_math:
            return self._uniform_numpy(size, shape, low, high, rows, dtype)
        indexed = rows is not None and rows.dtype != torch.bool
        key, counter = (self.key[rows], self.counter[rows]) if indexed else (self.key, self.counter)
        count = len(key)
        bits, scratch, unit = self._buffers(size, dtype, count)
        # One finalizer over (key, counter, lane): the key is already a mixed 32-bit value.
        torch.add(key, counter, alpha=_M1, out=bits[0])
        for lane in range(size - 1, -1, -1):  # lane 0 last: it reads its own row
            torch.add(bits[0], self._lanes[lane], out=bits[lane])
        _mix(bits, scratch)
        unit.copy_(torch.bitwise_right_shift(bits, _SHIFT_8, out=scratch).bitwise_and_(_MASK_24))
        unit.mul_((high - low) * _TO_UNIT).add_(low)
        if rows is None:
            self.counter += 1
        elif indexed:
            self.counter.index_add_(0, rows, self._ones[:count])
        else:
            self.counter += rows
        return unit.t().reshape(count, *shape) if len(shape) != 1 else unit.t()

    def _uniform_numpy(
        self, size: int, shape: tuple[int, ...], low: float, high: float, rows: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """:meth:`uniform` on the CPU, bit for bit: NumPy has unsigned shifts and costs less per call."""
        key, counter = self.key.numpy().view(np.uint32), self.counter.numpy().view(np.uint32)
        all_counters = counter
        picked = None if rows is None else rows.numpy()
        if picked is not None and picked.dtype != np.bool_:
            key, counter = key[picked], counter[picked]
        bits = (key + counter * _M1_NP)[None, :] + _LANES_NP[:size, None]
        t = np.empty_like(bits)
        for shift, multiplier in _ROUNDS_NP:
            np.right_shift(bits, shift, out=t)
            bits ^= t
            if multiplier is not None:
                bits *= multiplier
        np_dtype: np.dtype = _NUMPY_DTYPES.get(dtype) or torch.empty(0, dtype=dtype).numpy().dtype
        unit = np.right_shift(bits, _SHIFT_8_NP, out=t).astype(np_dtype)
        unit *= np_dtype.type((high - low) * _TO_UNIT)
        unit += np_dtype.type(low)
        if picked is None:
            all_counters += _ONE_NP
        elif picked.dtype == np.bool_:
            all_counters += picked
        else:
            all_counters[picked] += _ONE_NP
        return torch.from_numpy(unit.T.reshape(len(key), *shape) if len(shape) != 1 else unit.T)

    def _uniform_traced(
        self, size: int, shape: tuple[int, ...], low: float, high: float, rows: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """:meth:`uniform` bit for bit as pure operations, for a compiled step: scratch buffers and
        NumPy would break the graph, and the compiler fuses the draws into the step's loop."""
        indexed = rows is not None and rows.dtype != torch.bool
        key, counter = (self.key[rows], self.counter[rows]) if indexed else (self.key, self.counter)
        # Each lane's constant as a Python int: a tensor of them made on the host would be copied to the
        # device inside the step, which a CUDA graph cannot capture.
        base = key + counter * _M1
        h = torch.stack([base + _wrap(_M2 * (lane + 1)) for lane in range(size)])
        for shift, multiplier in ((16, _M1), (13, _M2), (16, None)):
            h = h ^ ((h >> shift) & ((1 << (32 - shift)) - 1))
            if multiplier is not None:
                h = h * multiplier
        unit = ((h >> 8) & 0xFFFFFF).to(dtype) * ((high - low) * _TO_UNIT) + low
        self._advance(rows, indexed)
        return unit.t().reshape(len(key), *shape) if len(shape) != 1 else unit.t()

    def uniform_columns(
        self, size: int, low: float, high: float, rows: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
    ) -> list[torch.Tensor]:
        """``uniform((size,), low, high, rows, dtype).unbind(1)``, the same bits, each draw's column its own
        tensor: in a compiled step, where a ``(num_envs, size)`` draw would be a pass of its own, a row at a
        time, when read more than once."""
        if not torch.compiler.is_compiling():
            return list(self.uniform((size,), low, high, rows, dtype).unbind(1))
        indexed = rows is not None and rows.dtype != torch.bool
        key, counter = (self.key[rows], self.counter[rows]) if indexed else (self.key, self.counter)
        base = key + counter * _M1
        columns = []
        for lane in range(size):
            h = base + _wrap(_M2 * (lane + 1))
            for shift, multiplier in ((16, _M1), (13, _M2), (16, None)):
                h = h ^ ((h >> shift) & ((1 << (32 - shift)) - 1))
                if multiplier is not None:
                    h = h * multiplier
            columns.append(((h >> 8) & 0xFFFFFF).to(dtype) * ((high - low) * _TO_UNIT) + low)
        self._advance(rows, indexed)
        return columns

    def _advance(self, rows: torch.Tensor | None, indexed: bool) -> None:
        if rows is None:
            self.counter += 1
        elif indexed:
            self.counter.index_add_(0, rows, torch.ones_like(rows, dtype=torch.int32))
        else:
            self.counter += rows

    def _buffers(self, size: int, dtype: torch.dtype, count: int) -> tuple[torch.Tensor, ...]:
        """Scratch tensors for ``size`` draws for up to ``num_envs`` envs, allocated on first use."""
        key = (size, dtype)
        if key not in self._scratch:
            n, device = self.num_envs, self.device
            self._lanes = [_int32(_wrap(_M2 * (lane + 1))) for lane in range(max(size, len(self._lanes)))]
            self._scratch[key] = (
                torch.empty(size, n, dtype=torch.int32, device=device),
                torch.empty(size, n, dtype=torch.int32, device=device),
                torch.empty(size, n, dtype=dtype, device=device),
            )
        if count == self.num_envs:
            return self._scratch[key]
        return tuple(t[:, :count] for t in self._scratch[key])
