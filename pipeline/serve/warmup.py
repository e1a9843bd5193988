"""Warm-up before the port opens: the first request must not pay for kernel compilation or CUDA-graph
capture. On CUDA every bucket up to the token budget is run (eager, capture, replay); on the CPU
one small step."""

from __future__ import annotations

import numpy as np

from petal.engine.batch import PackedBatch, token_buckets
from petal.engine.engine import Engine

REPEATS_PER_BUCKET = 3  # eager, capture, replay


def _batch(tokens: int, max_length: int, max_seqs: int) -> PackedBatch:
    lengths = [max_length] * (tokens // max_length) + ([tokens % max_length] if tokens % max_length else [])
    lengths = lengths[:max_seqs]
    return PackedBatch.from_sequences([np.full(n, 100, dtype=np.int32) for n in lengths])


def warm_up(engine: Engine) -> int:
    """Run the engine over every bucket it will meet; returns the steps run."""
    max_length = engine.pooling.max_length
    if engine.device.type != "cuda":
        engine.embed(_batch(min(16, max_length), max_length, 1))
        return 1
    steps = 0
    for bucket in token_buckets(engine.config.token_budget):
        batch = _batch(min(bucket, engine.config.token_budget), max_length, engine.config.max_seqs)
        for _ in range(REPEATS_PER_BUCKET):
            engine.embed(batch)
            steps += 1
    return steps
