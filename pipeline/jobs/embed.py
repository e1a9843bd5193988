"""Embedding a list of texts in order (``petal embed``, ``petal query``, benchmarks)."""

from __future__ import annotations

from collections import deque

import numpy as np

from petal.engine.engine import Engine
from petal.engine.lazy_tensor import LazyTensor
from petal.pipeline.ingest.pack import PackConfig, pack
from petal.pipeline.ingest.tokens import TextTokenizer


def encode_texts(engine: Engine, tokenizer: TextTokenizer, texts: list[str]) -> tuple[np.ndarray, int]:
    """``[len(texts), dim]`` float32 in input order, and how many texts were truncated."""
    if not texts:
        return np.zeros((0, engine.dim), dtype=np.float32), 0
    encoded = tokenizer.encode(texts)
    empty = [i for i, ids in enumerate(encoded.token_ids) if len(ids) == 0]
    if empty:
        raise ValueError(f"text {empty[0]} yields no tokens")
    config = PackConfig(engine.config.token_budget, engine.config.max_seqs)
    out = np.empty((len(texts), engine.dim), dtype=np.float32)
    in_flight: deque[tuple[list[int], LazyTensor]] = deque()
    for batch in pack(enumerate(encoded.token_ids), config):
        in_flight.append((list(batch.keys), engine.step(batch)))
        while len(in_flight) > engine.config.steps_in_flight:
            keys, lazy = in_flight.popleft()
            out[keys] = lazy.result()
    for keys, lazy in in_flight:
        out[keys] = lazy.result()
    return out, int(encoded.truncated.sum())
