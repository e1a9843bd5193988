"""The current CUDA stream as a ``torch.cuda.Stream``, looked up by its raw handle (one C call).

``torch.cuda.current_stream()`` builds a new ``Stream`` through several Python frames on every call; an
event's ``record()`` without a stream calls it. A lone step records two events before its result can
arrive, each on the path a query waits for (bench/prelaunch_probe.py), so the engine keeps one object
per stream and asks CUDA only which stream is current.
"""

from __future__ import annotations

import torch


class CurrentStream:
    """``get()`` -> the device's current stream; the same object while the current stream stays the same."""

    def __init__(self, device: torch.device) -> None:
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self._stream = torch.cuda.current_stream(self._index)
        self._raw = self._stream.cuda_stream

    def get(self) -> torch.cuda.Stream:
        raw = torch._C._cuda_getCurrentRawStream(self._index)
        if raw != self._raw:  # NOTE: a caller switched streams (torch.cuda.stream(...)): follow it
            self._stream = torch.cuda.current_stream(self._index)
            self._raw = self._stream.cuda_stream
        return self._stream
