"""The engine's input: sequences packed back to back, described by offsets, never padded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Buckets: 16 and 32 tokens (a lone query: its GEMMs stream the same weights with a quarter of the
# rows), then multiples of 64 tokens up to 1024, of 256 above. A CUDA graph is captured per bucket.
TINY_BUCKETS = (16, 32)
SMALL_BUCKET_STEP = 64
SMALL_BUCKET_MAX = 1024
LARGE_BUCKET_STEP = 256


def token_bucket(num_tokens: int) -> int:
    """The token capacity a batch of ``num_tokens`` is rounded up to (>= 16)."""
    for tiny in TINY_BUCKETS:
        if num_tokens <= tiny:
            return tiny
    if num_tokens <= SMALL_BUCKET_MAX:
        return -(-num_tokens // SMALL_BUCKET_STEP) * SMALL_BUCKET_STEP
    return -(-num_tokens // LARGE_BUCKET_STEP) * LARGE_BUCKET_STEP


def token_buckets(token_budget: int) -> list[int]:
    """Every bucket up to and including the one ``token_budget`` rounds to, ascending."""
    top = token_bucket(token_budget)
    buckets = [tiny for tiny in TINY_BUCKETS if tiny < top]
    buckets += range(SMALL_BUCKET_STEP, min(token_budget, SMALL_BUCKET_MAX) + 1, SMALL_BUCKET_STEP)
    size = SMALL_BUCKET_MAX + LARGE_BUCKET_STEP
    while size <= top:
        buckets.append(size)
        size += LARGE_BUCKET_STEP
    if not buckets or buckets[-1] != top:
        buckets.append(top)
    return buckets


@dataclass(frozen=True)
class PackedBatch:
    """Sequences concatenated along one token axis.

    Sequence ``i`` owns tokens ``cu_seqlens[i]:cu_seqlens[i + 1]``; its positions restart at 0.
    ``keys`` carries the caller's row keys, one per sequence, untouched by the engine.
    """

    input_ids: np.ndarray  # [num_tokens] int32
    positions: np.ndarray  # [num_tokens] int32, 0..len-1 per sequence
    cu_seqlens: np.ndarray  # [num_seqs + 1] int32, cu_seqlens[0] == 0
    max_seqlen: int
    keys: Sequence[Any] = ()

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.cu_seqlens.shape[0]) - 1

    @property
    def bucket(self) -> int:
        return token_bucket(self.num_tokens)

    @property
    def seqlens(self) -> np.ndarray:  # [num_seqs] int32
        return np.diff(self.cu_seqlens)

    @classmethod
    def from_sequences(cls, sequences: Sequence[np.ndarray], keys: Sequence[Any] = ()) -> PackedBatch:
        """Pack token-id arrays back to back (no padding)."""
        if not sequences:
            raise ValueError("cannot pack zero sequences")
        lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
        if (lengths <= 0).any():
            raise ValueError(f"sequence {int(np.argmin(lengths))} is empty; drop empty texts before packing")
        cu_seqlens = np.zeros(len(sequences) + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu_seqlens[1:])
        num_tokens = int(cu_seqlens[-1])
        input_ids = np.concatenate(sequences).astype(np.int32, copy=False)
        # positions: 0..len-1 per sequence, from one arange minus each token's sequence start
        starts = np.repeat(cu_seqlens[:-1], lengths)
        positions = (np.arange(num_tokens, dtype=np.int32) - starts).astype(np.int32, copy=False)
        return cls(
            input_ids=input_ids,
            positions=positions,
            cu_seqlens=cu_seqlens,
            max_seqlen=int(lengths.max()),
            keys=tuple(keys) if keys else tuple(range(len(sequences))),
        )
