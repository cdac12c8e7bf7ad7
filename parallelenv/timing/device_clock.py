"""The tensor backend's clock: each batch step's and reset's time, on its device.

On a CUDA device a step only enqueues kernels: its time is the device's,
between two CUDA events recorded around it, read when the stats are (a
step never waits for the device to measure it). On the CPU the operations
run as they are called: the time is the call's. Every env of a batch is a
row of one step, so each env's reading is the batch's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from parallelenv.timing.histogram import Histogram
from parallelenv.timing.host_clock import HostReading

PENDING_EVENTS = 4096  # event pairs kept unread on a device; past it, the oldest are read (they are done)


class DeviceClock:
    def __init__(self, device: Any) -> None:
        import torch

        self._torch = torch
        self.on_cuda = getattr(device, "type", str(device)).startswith("cuda")
        self.host = f"the caller's {device}"
        self.started = time.time()
        self._began = time.perf_counter()
        self.busy_s = 0.0
        self.steps, self.resets = Histogram(), Histogram()
        self._pending: list[tuple[Histogram, Any, Any]] = []

    def timed(self, histogram_name: str, run: Callable[[], Any]) -> Any:
        """``run()``, its time counted in the step or reset histogram."""
        histogram = self.steps if histogram_name == "step" else self.resets
        if not self.on_cuda:
            began = time.perf_counter()
            try:
                return run()
            finally:
                histogram.add(time.perf_counter() - began)
                self.busy_s += time.perf_counter() - began
        cuda = self._torch.cuda
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        result = run()
        end.record()
        self._pending.append((histogram, start, end))
        if len(self._pending) > PENDING_EVENTS:
            self._settle(self._pending[: PENDING_EVENTS // 2])
            del self._pending[: PENDING_EVENTS // 2]
        return result

    def _settle(self, pending: list[tuple[Histogram, Any, Any]]) -> None:
        for histogram, start, end in pending:
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
            histogram.add(seconds)
            self.busy_s += seconds

    def read(self, env_ids: tuple[int, ...]) -> list[HostReading]:
        self._settle(self._pending)
        self._pending = []
        alive = time.perf_counter() - self._began
        reading = HostReading(self.steps.copy(), self.resets.copy(), self.host, self.started, self.busy_s, alive)
        return [reading] * len(env_ids)
