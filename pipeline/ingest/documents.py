"""Rows -> documents: the checks that turn bad rows into counted, reported skips.

A row is skipped (never embedded, never silently lost) when its text is null, has nothing visible
(empty, whitespace, control and zero-width characters only), is bytes that are not UTF-8 (a UTF-8
encoded lone surrogate is named apart), or when its id is null, is bytes that are not UTF-8 (a string id
column: ``invalid_utf8_id``, a lone surrogate's encoding too) or repeats an id seen earlier in the same
shard. Each skip carries its shard, row and reason to the run report and rejects file.

Texts are embedded as given: petal does not normalise Unicode, so an NFC and an NFD spelling of one
text are two documents (the model's tokenizer may still map them to the same tokens, as
MiniLM's lower-casing, accent-stripping one does).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.parquet import ReadStats, RowBatch, ShardInfo, read_rows
from petal.pipeline.ingest.text_rule import VISIBLE
from petal.pipeline.ingest.text_rule import undecodable_reason as _undecodable

# NOTE: the read and tokenize stages hold up to this many record batches' text at once: the batch being read
# (Arrow's buffers of it, about 2.5 times its bytes, and its Python strings), up to ``TOKENIZE_WINDOW`` batches being
# tokenized (pipeline/ingest/tokens.py) and the one the next stage takes; each batch is read at
# ``read.max_batch_bytes / READ_WINDOW_BATCHES``, so ``read.max_batch_bytes`` bounds the window as a whole.
READ_WINDOW_BATCHES = 8

REJECT_REASONS = ("null_text", "empty_text", "invalid_utf8", "lone_surrogate", "null_id", "invalid_utf8_id",
                  "duplicate_id", "non_finite_embedding")


@dataclass
class Documents:
    """The rows of one ``RowBatch`` that will be embedded, plus the ones that will not."""

    shard_index: int
    rows: list[int]
    ids: list
    texts: list[str]
    rejects: list[tuple[int, str]] = field(default_factory=list)  # (row, reason)
    final: bool = False  # the last batch of its shard


def to_documents(batch: RowBatch, seen_ids: set) -> Documents:
    """Check one batch. ``seen_ids`` holds the ids of earlier rows of the same shard (updated)."""
    docs = Documents(batch.shard_index, [], [], [])
    for offset, (doc_id, text) in enumerate(zip(batch.ids, batch.texts)):
        row = batch.row_start + offset
        if doc_id is None:
            docs.rejects.append((row, "null_id"))
            continue
        if isinstance(doc_id, bytes):  # a string id whose bytes are not UTF-8 (``read_ids``): no text to key it by
            docs.rejects.append((row, "invalid_utf8_id"))
            continue
        if text is None:
            docs.rejects.append((row, "null_text"))
            continue
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError:
                docs.rejects.append((row, _undecodable(text)))
                continue
        if VISIBLE.search(text) is None:
            docs.rejects.append((row, "empty_text"))
            continue
        if doc_id in seen_ids:
            docs.rejects.append((row, "duplicate_id"))
            continue
        seen_ids.add(doc_id)
        docs.rows.append(row)
        docs.ids.append(doc_id)
        docs.texts.append(text)
    return docs


def window_read(read: ReadConfig) -> ReadConfig:
    """``read`` with record batches of ``read.max_batch_bytes / READ_WINDOW_BATCHES``: what the read and tokenize
    window holds (``READ_WINDOW_BATCHES`` batches at most) stays within ``read.max_batch_bytes``."""
    return replace(read, max_batch_bytes=max(1, read.max_batch_bytes // READ_WINDOW_BATCHES))


def read_documents(shards: list[ShardInfo], read: ReadConfig, stats: ReadStats | None = None) -> Iterator[Documents]:
    """Every shard's rows as checked ``Documents``, each shard closed by a ``final`` marker."""
    read = window_read(read)
    for shard_index, info in enumerate(shards):
        seen_ids: set = set()
        for batch in read_rows(shard_index, info, read, stats):
            yield to_documents(batch, seen_ids)
        yield Documents(shard_index, [], [], [], final=True)


def read_ranges(shards: list[ShardInfo], ranges: list, read: ReadConfig,
                stats: ReadStats | None = None) -> Iterator[Documents]:
    """The rows of each unit of ``ranges`` (``RowRange``: a whole shard or a row-group range of one), each unit
    closed by a ``final`` marker; ``Documents.shard_index`` is the unit's position in ``ranges``. Ids repeated
    across the ranges of one shard are found when its ranges are assembled (store/ranges.py)."""
    for unit, part in enumerate(ranges):
        yield from range_documents(unit, shards[part.position], part, read, stats)


def range_documents(unit: int, info: ShardInfo, part: Any, read: ReadConfig,
                    stats: ReadStats | None = None) -> Iterator[Documents]:
    """One unit's checked rows (``Documents`` numbered ``unit``), then its ``final`` marker."""
    seen_ids: set = set()
    for batch in read_rows(unit, info, window_read(read), stats, part.first_row, None if part.whole else part.stop_row):
        yield to_documents(batch, seen_ids)
    yield Documents(unit, [], [], [], final=True)
