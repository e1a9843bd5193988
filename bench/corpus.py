"""Benchmark texts: real sentences (from Parquet, e.g. sample_data/) joined to lengths drawn from a
seeded distribution, so every system sees the same texts."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from petal.pipeline.ingest.tokens import TextTokenizer


def load_sentences(source: Path, text_column: str = "text") -> list[str]:
    """Sentences of every text in the Parquet files under ``source``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from petal.pipeline.ingest.parquet import resolve_sources
    from petal.pipeline.reliability.errors import BadInputError, NoInputError, quote_names

    sentences: list[str] = []
    for path in resolve_sources([str(source)]):
        # NOTE: a file that is no Parquet, or lacks the text column, was a pyarrow traceback (exit 1)
        try:
            schema = pq.read_schema(path)
            if text_column not in schema.names:
                raise BadInputError(f"--corpus {path}: no {text_column!r} column (columns: "
                                    f"{quote_names(schema.names[:10])}): the benchmark's texts come from it")
            kind = schema.field(text_column).type
            if pa.types.is_dictionary(kind):  # NOTE: a pandas category column: its values are the texts (was 65)
                kind = kind.value_type
            if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
                    or getattr(pa.types, "is_string_view", lambda _: False)(kind)):
                raise BadInputError(f"--corpus {path}: column {text_column!r} is "
                                    f"{schema.field(text_column).type}, not text")
            texts = pq.read_table(path, columns=[text_column]).column(0).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise BadInputError(f"--corpus {path}: cannot read it as Parquet: {exc}") from exc
        for text in texts:
            if isinstance(text, str) and text.strip():
                sentences += [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s.strip()) > 3]
    if not sentences:
        raise NoInputError(f"--corpus {source}: no sentence of more than 3 characters in its {text_column!r} column: "
                           "the benchmark makes its texts of them")
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
