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

import functools
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
        """Each section's place in the buffer; every start is a multiple of ``SECTION_ALIGN``. (One dict per
        layout, computed once: every step asks; not to be changed.)"""
        return self._slices

    @functools.cached_property
    def _slices(self) -> dict[str, slice]:
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
    # NOTE: the padding first, from the layout's template in one copy (a lone step's host time goes before its
    # launch: bench/l1_host.py); then the batch's own entries over it
    template, spare = _padding(layout)
    size = layout.size
    host[:size] = template
    cu = sl["cu_seqlens"].start
    host[cu: cu + seqs + 1] = batch.cu_seqlens
    # NOTE: padding tokens form one extra sequence (slot ``seqs``), so the offsets always cover every
    # token row (kernels write every output row); later slots are zero-length sequences (the template's).
    first, last = sl["first_token_idx"].start, sl["last_token_idx"].start
    host[first: first + seqs] = batch.cu_seqlens[:-1]
    np.subtract(batch.cu_seqlens[1:], 1, out=host[last: last + seqs])
    lengths = np.diff(batch.cu_seqlens)
    inv = sl["inv_seqlens"].start
    host[inv: inv + seqs].view(np.float32)[:] = 1.0 / lengths
    ids, pos, seq_ids = sl["input_ids"].start, sl["positions"].start, sl["token_seq_ids"].start
    host[ids: ids + tokens] = batch.input_ids
    host[pos: pos + tokens] = batch.positions
    # the padding sequence's own positions 0.. (the template's positions are 0..T-1 from the first token)
    host[pos + tokens: pos + layout.num_tokens] = spare[: layout.num_tokens - tokens]
    host[seq_ids: seq_ids + tokens] = np.repeat(np.arange(seqs, dtype=np.int32), lengths)
    host[seq_ids + tokens: seq_ids + layout.num_tokens] = seqs  # padding pools into its own slot, never returned


@functools.cache
def _padding(layout: InputLayout) -> tuple[np.ndarray, np.ndarray]:
    """A layout's buffer before any batch (offsets all at ``num_tokens``, everything else 0) and ``0..T-1``."""
    template = np.zeros(layout.size, dtype=np.int32)
    template[layout.slices()["cu_seqlens"]] = layout.num_tokens
    return template, np.arange(layout.num_tokens, dtype=np.int32)


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
        # NOTE: one event per slot, made once and recorded again at each release (creating one per step
        # cost a lone step's host ~10 us before its launch: bench/l1_host.py)
        self._events = [torch.cuda.Event() for _ in range(depth)] if pin else None
        self._recorded = [False] * depth
        self._next = 0

    def acquire(self) -> tuple[int, torch.Tensor]:
        """A free slot: waits only if the copy that last read it has not executed yet."""
        slot = self._next
        self._next = (slot + 1) % len(self._slots)
        if self._recorded[slot]:
            assert self._events is not None
            self._events[slot].synchronize()  # NOTE: the slot's previous H2D copy (and plan) must have read it
            self._recorded[slot] = False
        return slot, self._slots[slot]

    def release(self, slot: int) -> None:
        """Mark the slot as read by everything enqueued so far on the current stream."""
        if self._events is not None:
            self._events[slot].record()
            self._recorded[slot] = True
