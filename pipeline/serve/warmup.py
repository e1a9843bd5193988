"""Warm-up before the port opens: the first request must not pay for kernel compilation or CUDA-graph
capture. On CUDA every bucket up to the token budget is run (eager, capture, replay); on the CPU
one small step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from petal.engine.batch import PackedBatch, token_buckets

if TYPE_CHECKING:  # NOTE: torch; imported by a server that may run no model
    from petal.engine.engine import Engine

REPEATS_PER_BUCKET = 3  # eager, capture, replay
WARM_TOKEN_ID = 100  # any id of the vocabulary: the step's cost does not depend on it


def _batch(tokens: int, max_length: int, max_seqs: int, vocab_size: int) -> PackedBatch:
    lengths = [max_length] * (tokens // max_length) + ([tokens % max_length] if tokens % max_length else [])
    lengths = lengths[:max_seqs]
    # NOTE: inside the vocabulary: a small model (a test's, a distilled one) may have fewer than 100 tokens, and
    # an id past it fails the embedding lookup (IndexError on the CPU, a device assert on CUDA): no server
    token_id = min(WARM_TOKEN_ID, vocab_size - 1)
    return PackedBatch.from_sequences([np.full(n, token_id, dtype=np.int32) for n in lengths])


def warm_up(engine: Engine) -> int:
    """Run the engine over every bucket it will meet; returns the steps run."""
    max_length = engine.pooling.max_length
    vocab_size = engine.spec.config.vocab_size
    if engine.device.type != "cuda":
        engine.embed(_batch(min(16, max_length), max_length, 1, vocab_size))
        return 1
    steps = 0
    for bucket in token_buckets(engine.config.token_budget):
        batch = _batch(min(bucket, engine.config.token_budget), max_length, engine.config.max_seqs, vocab_size)
        for _ in range(REPEATS_PER_BUCKET):
            engine.embed(batch)
            steps += 1
    return steps
