"""Benchmark texts: real sentences (from Parquet, e.g. sample_data/) joined to lengths drawn from a
seeded distribution, so every system sees the same texts."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from petal.pipeline.ingest.tokens import TextTokenizer


def load_sentences(source: Path, text_column: str = "text") -> list[str]:
    """Sentences of every text in the Parquet files under ``source``."""
    import pyarrow.parquet as pq

    from petal.pipeline.ingest.parquet import resolve_sources

    sentences: list[str] = []
    for path in resolve_sources([str(source)]):
        for text in pq.read_table(path, columns=[text_column]).column(0).to_pylist():
            if isinstance(text, str) and text.strip():
                sentences += [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.strip()) > 3]
    if not sentences:
        raise ValueError(f"no text found under {source}")
    return sentences


def lognormal_lengths(count: int, median: float, sigma: float, low: int, high: int, seed: int = 0) -> np.ndarray:
    """Token lengths ~ lognormal(median, sigma) clipped to [low, high] (T2: 150, 0.8, 8, 512)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(median), sigma, count), low, high).astype(np.int64)


def make_texts(sentences: list[str], tokenizer: TextTokenizer, lengths: np.ndarray, seed: int = 0) -> list[str]:
    """One text per target length: random sentences joined until the tokenizer count reaches it."""
    rng = np.random.default_rng(seed)
    sentence_tokens = [len(ids) - 2 for ids in tokenizer.encode(sentences).token_ids]  # minus [CLS]/[SEP]
    texts = []
    for target in lengths:
        parts, tokens = [], 2
        while tokens < target:
            i = int(rng.integers(len(sentences)))
            parts.append(sentences[i])
            tokens += max(sentence_tokens[i], 1)
        texts.append(" ".join(parts))
    return texts
