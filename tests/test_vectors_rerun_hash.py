"""A rerun of ``petal index --vectors-column`` reuses each unchanged shard's sha256 from its store entry, as a text
run does, instead of reading every byte of every shard again: its preflight left the footer hash out of the
shard's identity, which the store requires before it trusts a recorded hash (``same_file``), so a nothing-to-do
run over 595 MB of vector shards hashed all of them (4.2 s of its 4.7 s). Real Parquet, the real store."""

from __future__ import annotations

import json
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import petal
from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.vectors import preflight_vectors
from petal.pipeline.store.embeddings import RACY_NS, EmbeddingStore

DIM = 8


def test_a_rerun_takes_an_unchanged_vector_shards_sha256_from_its_entry(tmp_path):
    shard = tmp_path / "a.parquet"
    flat = np.random.default_rng(0).standard_normal((20, DIM)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": np.arange(20), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                   shard)
    time.sleep(RACY_NS / 1e9 + 0.2)  # NOTE: a file hashed right after its last change is never trusted (racy)
    out = tmp_path / "out"
    assert petal.index([shard], out, vectors_column="emb", quiet=True).status == "success"
    (entry,) = (out / "store" / "shards").glob("*/*/entry.json")
    recorded = json.loads(entry.read_text())["source"]

    store = EmbeddingStore(out / "store")
    (info,), _ = preflight_vectors([shard], ReadConfig(), "emb")
    assert store.content_sha256(info) == recorded["sha256"]
    assert store.hashed_at_ns(info) == recorded["hashed_at_ns"]  # the entry's hash, not one read again now
    assert petal.index([shard], out, vectors_column="emb", quiet=True).status == "nothing-to-do"

    pq.write_table(pq.read_table(shard).slice(0, 10), shard)  # changed: hashed again, a new entry
    (info,), _ = preflight_vectors([shard], ReadConfig(), "emb")
    assert EmbeddingStore(out / "store").content_sha256(info) != recorded["sha256"]
