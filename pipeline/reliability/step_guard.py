"""Engine steps that survive a device out of memory, and a clean stop on a fatal device error.

A step that raises ``torch.OutOfMemoryError`` is split into two halves by sequence, each retried
(recursively, the same way) and joined back in order, so the vectors are those of the whole batch;
every split is counted. A single sequence that still does not fit, or a CUDA error that leaves the
process unusable (illegal address, device-side assert, ...), ends the run with exit 75: shards
committed so far stay in the store, and a new process resumes from them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from petal.engine.batch import PackedBatch
from petal.engine.lazy_tensor import LazyTensor
from petal.pipeline.reliability.errors import TemporaryFailure
from petal.pipeline.reliability.faults import fault

# Messages of CUDA errors after which the CUDA context cannot be trusted (older torch raises them as
# a plain RuntimeError; torch >= 2.8 as ``torch.AcceleratorError``).
FATAL_MARKERS = ("CUDA error", "CUBLAS_STATUS", "cuDNN error", "CUDA driver error", "device-side assert")


def split_batch(batch: PackedBatch) -> tuple[PackedBatch, PackedBatch]:
    """The first and second half of ``batch``'s sequences (keys and order kept)."""
    assert batch.num_seqs >= 2
    bounds = batch.cu_seqlens
    seqs = [batch.input_ids[bounds[i] : bounds[i + 1]] for i in range(batch.num_seqs)]
    keys = list(batch.keys)
    half = batch.num_seqs // 2
    return (PackedBatch.from_sequences(seqs[:half], keys[:half]),
            PackedBatch.from_sequences(seqs[half:], keys[half:]))


def device_failure(exc: BaseException) -> TemporaryFailure | None:
    """The exit-75 error for a device failure no retry in this process can fix, else ``None``."""
    if isinstance(exc, torch.OutOfMemoryError):
        return TemporaryFailure(f"device out of memory ({_first_line(exc)}); finished shards are committed: "
                                "rerun to resume, with a lower --token-budget or --max-length if it repeats")
    if isinstance(exc, torch.AcceleratorError) or (isinstance(exc, RuntimeError)
                                                   and any(m in str(exc) for m in FATAL_MARKERS)):
        return TemporaryFailure(f"fatal device error ({_first_line(exc)}); finished shards are committed: "
                                "rerun in a new process to resume")
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class StepGuard:
    """``step(batch)`` like ``Engine.step``, splitting a batch the device has no memory for."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.splits = 0

    def step(self, batch: PackedBatch) -> LazyTensor:
        try:
            fault("engine_step")
            return self.engine.step(batch)
        except torch.OutOfMemoryError as exc:
            if batch.num_seqs < 2:
                raise TemporaryFailure(
                    f"device out of memory on a single sequence of {batch.num_tokens} tokens ({_first_line(exc)}); "
                    "lower --max-length, or rerun when the device has more free memory") from exc
            self.splits += 1
            # NOTE: give the caching allocator's free blocks back before the halves allocate again.
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            first, second = split_batch(batch)
            return LazyTensor.ready(np.concatenate([self.step(first).result(), self.step(second).result()]))
