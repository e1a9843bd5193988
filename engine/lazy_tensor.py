"""LazyTensor: a step's result on its way from the device to the host.

On CUDA, ``HostRing.submit`` copies the device result into a pinned host slot with an async copy
on a side stream and records an event; ``LazyTensor.result()`` waits for that event only. The
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
        self._staging = (
            [torch.empty(max_rows, dim, dtype=torch.float32, device=device) for _ in range(depth)] if pin else None
        )
        self._owners: list[LazyTensor | None] = [None] * depth
        self._next = 0
        self._copy_stream = torch.cuda.Stream(device=device) if pin else None

    @property
    def depth(self) -> int:
        return len(self._host)

    def submit(self, result: torch.Tensor) -> LazyTensor:
        """Start moving ``result [rows, dim]`` (device, float32) to the host; return at once."""
        rows = int(result.shape[0])
        if rows > self.max_rows:
            raise ValueError(f"result has {rows} rows, ring slots hold {self.max_rows}")
        slot = self._next
        self._next = (slot + 1) % len(self._host)
        previous = self._owners[slot]
        if previous is not None:
            previous.result()  # NOTE: materialise the slot's last result before reusing the slot
        host = self._host[slot]
        if self._copy_stream is None:
            host[:rows].copy_(result)
            lazy = LazyTensor(host, rows)
        else:
            assert self._staging is not None
            staging = self._staging[slot][:rows]
            # NOTE: copy on the compute stream first (device to device, tiny): a CUDA graph's output
            # buffer is overwritten by the next replay, which is queued on this same stream.
            staging.copy_(result)
            computed = torch.cuda.Event()
            computed.record()
            with torch.cuda.stream(self._copy_stream):
                self._copy_stream.wait_event(computed)
                host[:rows].copy_(staging, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(self._copy_stream)
            lazy = LazyTensor(host, rows, copied, staging)
        self._owners[slot] = lazy
        return lazy
