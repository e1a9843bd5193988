"""Bounded memory (RELIABILITY.md promise 9): a shard's writer holds the rows and ids of what it has stored as arrays,
8 bytes a row and a string id's own bytes, not as Python lists (an int object per row, every id's str kept alive:
~100 bytes a row, 200 MB for a shard of 2M rows on top of the bounded read window). Measured with tracemalloc (the
Python heap, numpy's arrays included) and Arrow's allocator; the entry it commits is the same."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS = 200_000
BATCH = 1000


def test_a_shard_writer_holds_compact_rows_and_ids(tmp_path: Path):
    from petal.pipeline.config import ReadConfig
    from petal.pipeline.ingest.parquet import preflight
    from petal.pipeline.store.embeddings import EmbeddingStore

    shard = tmp_path / "big.parquet"
    pq.write_table(pa.table({"id": [f"document-{i:09d}" for i in range(ROWS)], "text": ["t"] * ROWS}), shard)
    [info] = preflight([shard], ReadConfig())
    store = EmbeddingStore(tmp_path / "store")
    store.open()
    store.remember_sha256([info], ["0" * 64])
    writer = store.writer(info, "fp", {}, 2)
    vectors = np.ones((BATCH, 2), np.float32)
    order = list(range(0, ROWS, BATCH))
    order[0], order[-1] = order[-1], order[0]  # batches out of order: the entry sorts them
    tracemalloc.start()
    arrow_before = pa.total_allocated_bytes()
    for start in order:
        rows = list(range(start, start + BATCH))
        writer.add(rows, [f"document-{r:09d}" for r in rows], vectors * start)
    held = tracemalloc.get_traced_memory()[0] + pa.total_allocated_bytes() - arrow_before
    tracemalloc.stop()
    assert held / ROWS < 40, held / ROWS  # bytes a row; was ~110
    writer.input_done = True
    entry = writer.commit()
    stored = pq.read_table(entry.path / "rows.parquet")
    assert stored.column("row").to_pylist() == list(range(ROWS))
    assert stored.column("id").to_pylist() == [f"document-{i:09d}" for i in range(ROWS)]
    assert np.array_equal(np.load(entry.path / "embeddings.npy")[::BATCH, 0], np.arange(0, ROWS, BATCH))
