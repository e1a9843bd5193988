"""One step's inputs in a single int32 buffer, filled on the host and moved with one copy.

Layout for ``num_seqs`` sequence slots and ``num_tokens`` token slots (all int32, the float
``inv_seqlens`` stored as raw bits); a padded layout has one slot more than the batches it takes,
for the sequence that holds the padding tokens::

    cu_seqlens [S+1] | first_token_idx [S] | last_token_idx [S] | inv_seqlens [S] (float32 bits)
    | input_ids [T] | positions [T] | token_seq_ids [T]

Every section starts on a 64-byte boundary (``SECTION_ALIGN`` int32 values): Triton specialises
kernels on 16-byte pointer alignment, so an unaligned ``positions`` view would compile a second
variant of a kernel at the first step (and the warm-up would have compiled the wrong one).

On CUDA the host side lives in a ring of pinned slots; a slot is refilled only after the copy
that read it has executed (an event per slot), so the host can run ahead of the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from petal.engine.batch import PackedBatch
from petal.engine.context import ForwardContext

if TYPE_CHECKING:
    from petal.engine.layers.attention import AttentionBackend
    from petal.engine.small_batch import SmallBatchKernels

SECTION_ALIGN = 16  # int32 values: 64 bytes


def _aligned(offset: int) -> int:
    return -(-offset // SECTION_ALIGN) * SECTION_ALIGN


@dataclass(frozen=True)
class InputLayout:
    num_tokens: int  # token slots T (>= the batch's tokens; padding tokens form one extra sequence)
    num_seqs: int  # sequence slots S (> the batch's sequences when padded; extra slots are zero-length)

    @property
    def size(self) -> int:
        return int(self.slices()["token_seq_ids"].stop)

    def slices(self) -> dict[str, slice]:
        """Each section's place in the buffer; every start is a multiple of ``SECTION_ALIGN``."""
        s, t = self.num_seqs, self.num_tokens
        bounds = {"cu_seqlens": s + 1, "first_token_idx": s, "last_token_idx": s, "inv_seqlens": s,
                  "input_ids": t, "positions": t, "token_seq_ids": t}
        out, start = {}, 0
        for name, length in bounds.items():
            out[name] = slice(start, start + length)
            start = _aligned(start + length)
        return out


def fill_inputs(host: np.ndarray, layout: InputLayout, batch: PackedBatch) -> None:
    """Write ``batch`` padded to ``layout`` into ``host`` (int32, at least ``layout.size`` long)."""
    seqs, tokens = batch.num_seqs, batch.num_tokens
    assert tokens <= layout.num_tokens, (tokens, layout.num_tokens)
    # a padded layout keeps a spare slot for the padding sequence
    assert seqs < layout.num_seqs or (seqs == layout.num_seqs and tokens == layout.num_tokens), (seqs, layout)
    sl = layout.slices()
    cu = host[sl["cu_seqlens"]]
    cu[: seqs + 1] = batch.cu_seqlens
    # NOTE: padding tokens form one extra sequence (slot ``seqs``), so the offsets always cover every
    # token row (kernels write every output row); later slots are zero-length sequences.
    cu[seqs + 1 :] = layout.num_tokens
    lengths = np.diff(batch.cu_seqlens)
    first, last = host[sl["first_token_idx"]], host[sl["last_token_idx"]]
    first[:seqs] = batch.cu_seqlens[:-1]
    last[:seqs] = batch.cu_seqlens[1:] - 1
    first[seqs:] = 0
    last[seqs:] = 0
    inv = host[sl["inv_seqlens"]].view(np.float32)
    inv[:seqs] = 1.0 / lengths
    inv[seqs:] = 0.0
    ids, pos, seq_ids = host[sl["input_ids"]], host[sl["positions"]], host[sl["token_seq_ids"]]
    ids[:tokens] = batch.input_ids
    pos[:tokens] = batch.positions
    seq_ids[:tokens] = np.repeat(np.arange(seqs, dtype=np.int32), lengths)
    ids[tokens:] = 0
    pos[tokens:] = np.arange(layout.num_tokens - tokens, dtype=np.int32)  # the padding sequence's own positions
    seq_ids[tokens:] = seqs  # padding pools into its own slot, which is never returned


def make_context(buffer: torch.Tensor, host_cu: torch.Tensor, layout: InputLayout, max_seqlen: int,
                 attention: AttentionBackend, padded: bool, small: SmallBatchKernels | None = None) -> ForwardContext:
    """A ``ForwardContext`` of views into ``buffer`` (int32, on the model's device); ``small`` marks the
    small-batch kernels the step's shapes run."""
    sl = layout.slices()
    ctx = ForwardContext(
        cu_seqlens=buffer[sl["cu_seqlens"]],
        cu_seqlens_cpu=host_cu,
        max_seqlen=max_seqlen,
        num_seqs=layout.num_seqs,
        token_seq_ids=buffer[sl["token_seq_ids"]],
        inv_seqlens=buffer[sl["inv_seqlens"]].view(torch.float32),
        first_token_idx=buffer[sl["first_token_idx"]],
        last_token_idx=buffer[sl["last_token_idx"]],
        attention=attention,
        padded=padded,
        input_ids=buffer[sl["input_ids"]],
        positions=buffer[sl["positions"]],
    )
    if small is not None:
        small.apply(ctx, layout.num_tokens)
    return ctx


class StagingRing:
    """Host buffers for step inputs: pinned on CUDA, reused round-robin behind per-slot events."""

    def __init__(self, depth: int, capacity: int, device: torch.device) -> None:
        pin = device.type == "cuda"
        self._slots = [torch.zeros(capacity, dtype=torch.int32, pin_memory=pin) for _ in range(depth)]
        self._events: list[torch.cuda.Event | None] = [None] * depth
        self._next = 0

    def acquire(self) -> tuple[int, torch.Tensor]:
        """A free slot: waits only if the copy that last read it has not executed yet."""
        slot = self._next
        self._next = (slot + 1) % len(self._slots)
        event = self._events[slot]
        if event is not None:
            event.synchronize()  # NOTE: the slot's previous H2D copy (and plan) must have read it
            self._events[slot] = None
        return slot, self._slots[slot]

    def release(self, slot: int) -> None:
        """Mark the slot as read by everything enqueued so far on the current stream."""
        if self._slots[slot].is_pinned():
            event = torch.cuda.Event()
            event.record()
            self._events[slot] = event
