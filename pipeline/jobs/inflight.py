"""Steps in flight: submit returns at once; results are read only when the window is full."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator

import numpy as np

from petal.engine.batch import PackedBatch
from petal.engine.lazy_tensor import LazyTensor


class InFlight:
    """A FIFO of ``(batch, LazyTensor)`` at most ``depth`` deep.

    ``push`` yields the oldest finished steps once more than ``depth`` are pending, so the
    host prepares batch N+1 while the device still runs batch N. ``wait_s`` adds up the time
    the host spent blocked on results (the device was behind).
    """

    def __init__(self, depth: int) -> None:
        self.depth = max(1, depth)
        self._queue: deque[tuple[PackedBatch, LazyTensor]] = deque()
        self.wait_s = 0.0

    def _result(self, lazy: LazyTensor) -> np.ndarray:
        started = time.perf_counter()
        try:
            return lazy.result()
        finally:
            self.wait_s += time.perf_counter() - started

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, batch: PackedBatch, lazy: LazyTensor) -> Iterator[tuple[PackedBatch, np.ndarray]]:
        self._queue.append((batch, lazy))
        while len(self._queue) > self.depth:
            done, result = self._queue.popleft()
            yield done, self._result(result)

    def drain(self) -> Iterator[tuple[PackedBatch, np.ndarray]]:
        while self._queue:
            done, result = self._queue.popleft()
            yield done, self._result(result)
