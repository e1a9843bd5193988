"""Packing: sequences first-come-first-served into batches bounded by tokens and sequences.

Pure (no torch, no device): the GPU saturates on tokens, not sequences, so a batch is filled up to
``token_budget`` tokens (at most ``max_seqs`` sequences) with no padding between sequences. The
engine rounds each batch up to its bucket (``engine.batch.token_bucket``) for CUDA-graph reuse.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from petal.engine.batch import PackedBatch, token_bucket


@dataclass(frozen=True)
class PackConfig:
    token_budget: int
    max_seqs: int

    def __post_init__(self) -> None:
        if self.token_budget < 1 or self.max_seqs < 1:
            raise ValueError(f"token budget {self.token_budget} and max_seqs {self.max_seqs} must be >= 1")


def plan_batches(lengths: Sequence[int], config: PackConfig) -> list[range]:
    """Index ranges of consecutive sequences per batch, first come first served.

    Every sequence lands in exactly one batch, in order; no batch exceeds the budget or
    ``max_seqs``. A sequence longer than the budget is an error (truncate first).
    """
    batches: list[range] = []
    start = 0
    tokens = 0
    for i, length in enumerate(lengths):
        if length > config.token_budget:
            raise ValueError(f"sequence {i} has {length} tokens, over the token budget {config.token_budget}")
        if i > start and (tokens + length > config.token_budget or i - start >= config.max_seqs):
            batches.append(range(start, i))
            start, tokens = i, 0
        tokens += length
    if len(lengths) > start:
        batches.append(range(start, len(lengths)))
    return batches


class Packer:
    """Incremental form of ``plan_batches``: ``add`` returns a full batch when the next sequence
    does not fit; ``flush`` returns what is left."""

    def __init__(self, config: PackConfig) -> None:
        self.config = config
        self._seqs: list[np.ndarray] = []
        self._keys: list[Hashable] = []
        self._tokens = 0

    @property
    def pending_tokens(self) -> int:
        return self._tokens

    def add(self, key: Hashable, token_ids: np.ndarray) -> PackedBatch | None:
        length = len(token_ids)
        if length == 0:
            raise ValueError(f"sequence {key!r} is empty")
        if length > self.config.token_budget:
            raise ValueError(f"sequence {key!r} has {length} tokens, over the token budget {self.config.token_budget}")
        full = None
        if self._seqs and (self._tokens + length > self.config.token_budget or len(self._seqs) >= self.config.max_seqs):
            full = self.flush()
        self._seqs.append(token_ids)
        self._keys.append(key)
        self._tokens += length
        return full

    def flush(self) -> PackedBatch | None:
        if not self._seqs:
            return None
        batch = PackedBatch.from_sequences(self._seqs, self._keys)
        self._seqs, self._keys, self._tokens = [], [], 0
        return batch


def pack(items: Iterable[tuple[Hashable, np.ndarray]], config: PackConfig) -> Iterator[PackedBatch]:
    """Pack ``(key, token_ids)`` pairs into batches (see ``Packer``)."""
    packer = Packer(config)
    for key, token_ids in items:
        batch = packer.add(key, token_ids)
        if batch is not None:
            yield batch
    last = packer.flush()
    if last is not None:
        yield last


def padded_tokens(batch: PackedBatch) -> int:
    """Tokens a CUDA graph adds to reach this batch's bucket."""
    return token_bucket(batch.num_tokens) - batch.num_tokens
