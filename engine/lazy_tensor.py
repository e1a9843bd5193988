"""LazyTensor: a step's result on its way from the device to the host.

On CUDA, ``HostRing.submit`` copies the device result into a pinned host slot with an async copy
on the compute stream and records an event; ``LazyTensor.result()`` waits for that event only. The
pipeline keeps several steps in flight, so the host prepares step N+1 while the device runs step N.
On the CPU the result is ready at once, behind the same interface.
"""

from __future__ import annotations

import numpy as np
import torch


class LazyTensor:
    """``result()`` -> ``np.ndarray [num_rows, dim]`` float32, waiting for the device if needed."""

    __slots__ = ("_device", "_event", "_host", "_num_rows", "_value")

    def __init__(
        self,
        host: torch.Tensor | None,
        num_rows: int,
        event: torch.cuda.Event | None = None,
        device_tensor: torch.Tensor | None = None,
        value: np.ndarray | None = None,
    ) -> None:
        self._host = host
        self._num_rows = num_rows
        self._event = event
        # NOTE: holds the device source alive until the async copy has run (the caching allocator
        # could otherwise hand its memory to the next step while the copy is still queued).
        self._device = device_tensor
        self._value = value

    @classmethod
    def ready(cls, value: np.ndarray) -> LazyTensor:
        return cls(None, int(value.shape[0]), value=value)

    @property
    def num_rows(self) -> int:
        return self._num_rows

    def done(self) -> bool:
        """True when ``result()`` will not block."""
        return self._value is not None or self._event is None or self._event.query()

    def result(self) -> np.ndarray:
        if self._value is None:
            if self._event is not None:
                self._event.synchronize()
            assert self._host is not None
            # NOTE: copy out of the ring slot: the slot is reused by a later step.
            self._value = self._host[: self._num_rows].numpy().copy()
            self._host = self._device = self._event = None
        return self._value


class HostRing:
    """``depth`` reusable host buffers ``[max_rows, dim]`` (pinned on CUDA) for step results.

    A slot is handed out again only after the result that last used it has been materialised,
    so a reused slot never clobbers a result nobody has read yet.
    """

    def __init__(self, depth: int, max_rows: int, dim: int, device: torch.device) -> None:
        if depth < 1:
            raise ValueError(f"ring depth {depth} < 1")
        pin = device.type == "cuda"
        self.device = device
        self.max_rows = max_rows
        self._host = [torch.empty(max_rows, dim, dtype=torch.float32, pin_memory=pin) for _ in range(depth)]
        self._pinned = pin
        # NOTE: one event per slot, made once: a slot is recorded again only after its last result was read
        self._events = [torch.cuda.Event() for _ in range(depth)] if pin else []
        self._owners: list[LazyTensor | None] = [None] * depth
        self._next = 0

    @property
    def depth(self) -> int:
        return len(self._host)

    def submit(self, result: torch.Tensor, stream: torch.cuda.Stream | None = None) -> LazyTensor:
        """Start moving ``result [rows, dim]`` (device, float32) to the host; return at once. ``stream``: the
        current CUDA stream when the caller has it (else looked up)."""
        rows = int(result.shape[0])
        if rows > self.max_rows:
            raise ValueError(f"result has {rows} rows, ring slots hold {self.max_rows}")
        slot = self._next
        self._next = (slot + 1) % len(self._host)
        previous = self._owners[slot]
        if previous is not None:
            previous.result()  # NOTE: materialise the slot's last result before reusing the slot
        host = self._host[slot]
        if not self._pinned:
            host[:rows].copy_(result)
            lazy = LazyTensor(host, rows)
        else:
            # NOTE: straight from the result to the pinned slot, on the compute stream: the next step (whose
            # CUDA graph overwrites the shared output buffer the result may be a view of) is queued after this
            # copy on the same stream. A result is at most max_seqs rows (a few hundred KB: microseconds beside
            # a step); the copy stream this replaced cost a lone step a device-to-device copy and a
            # cross-stream event wait (bench/l1_host.py).
            host[:rows].copy_(result, non_blocking=True)
            copied = self._events[slot]
            copied.record(stream)  # NOTE: the current stream, the copy's (the engine's device is the current one)
            lazy = LazyTensor(host, rows, copied, result)
        self._owners[slot] = lazy
        return lazy
