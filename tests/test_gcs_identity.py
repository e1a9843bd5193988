"""``gs://`` objects' stored URIs (tests/gcs_emulation.py: no GCS here): one object is one shard whichever scheme
names it, two servers' objects of one bucket and key are two, and a public bucket read anonymously is read so again.

Before: ``gcs://b/k`` and ``gs://b/k`` (one filesystem) were two shards, and the copy indexed first stayed beside the
new one after the object changed (a search could return the stale text); ``gs://anonymous@b/k`` was stored as
``gs://b/k``, so a search (no SOURCE) opened it with the credential chain: records None, the shard 'unreadable'.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from tests.fake_cli import invoke
from tests.fake_engine import embedded_ids, make_fake_model_dir
from tests.gcs_emulation import emulate_gcs

LOCAL, OTHER = "http://127.0.0.1:4443", "http://127.0.0.1:4444"  # GCS emulators' endpoints (fake-gcs-server's)


def at(endpoint: str, uri: str) -> str:
    """``uri`` as a SOURCE of the emulator at ``endpoint`` (``?endpoint_override=HOST:PORT&scheme=http``)."""
    scheme, _, host = endpoint.partition("://")
    return f"{uri}?endpoint_override={host}&scheme={scheme}"


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def put(root: Path, path: str, prefix: str, rows: int, edition: int = 0) -> list[str]:
    """An object at ``path`` (``bucket/key``) of the server stored under ``root``; its ids."""
    ids = [f"{prefix}-{i}" for i in range(rows)]
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "text": [f"{prefix} document {i} edition {edition}" for i in range(rows)]}),
                   target)
    return ids


def index(out: Path, model: Path, log: Path, *args: str):
    return invoke(["index", *args, "--out", str(out), "--model", str(model), "-q"],
                  env={"PETAL_TEST_FAKE_ENGINE": str(log)})


def shards(out: Path) -> list[tuple[str, int]]:
    return sorted((record.abs_path, record.rows) for record in IndexReader(out).manifest.shards)


def shown_texts(out: Path, tmp_path: Path) -> dict[str, str | None]:
    """Each hit's text as ``petal query --show-text`` reads it from its shard (no SOURCE: the stored URI alone)."""
    np.save(tmp_path / "q.npy", IndexReader(out).index.reconstruct(0))
    shown = invoke(["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "9", "--json", "--show-text"])
    assert shown.exit_code == 0, shown.output
    return {h["id"]: h.get("text") for h in json.loads(shown.stdout)["hits"]}


def test_gcs_and_gs_of_one_object_are_one_shard(fake_model, tmp_path, monkeypatch):
    emulate_gcs(monkeypatch, {"": tmp_path / "google"})
    put(tmp_path / "google", "bkt/p/a.parquet", "a", 3)
    out, log = tmp_path / "out", tmp_path / "log"
    first = index(out, fake_model, log, "gcs://bkt/p/a.parquet")
    assert first.exit_code == 0, first.output
    assert shards(out) == [("gs://bkt/p/a.parquet", 3)]
    ids = put(tmp_path / "google", "bkt/p/a.parquet", "a", 3, edition=1)
    second = index(out, fake_model, tmp_path / "log2", "gs://bkt/p/a.parquet", "--json-report",
                   str(tmp_path / "r.json"))
    assert second.exit_code == 0, second.output
    assert json.loads((tmp_path / "r.json").read_text())["shard_changes"]["changed"] == ["gs://bkt/p/a.parquet"]
    assert embedded_ids(tmp_path / "log2") == ids
    assert shards(out) == [("gs://bkt/p/a.parquet", 3)]
    assert shown_texts(out, tmp_path) == {i: f"a document {i[-1]} edition 1" for i in ids}


def test_two_gcs_servers_objects_of_one_bucket_and_key_are_two_shards(fake_model, tmp_path, monkeypatch):
    """In one run (Google's endpoint and an emulator's) or two (two emulators' endpoints)."""
    emulate_gcs(monkeypatch, {"": tmp_path / "google", LOCAL: tmp_path / "local", OTHER: tmp_path / "other"})
    ids = put(tmp_path / "google", "bkt/p/a.parquet", "one", 2) + put(tmp_path / "local", "bkt/p/a.parquet", "two", 3)
    out = tmp_path / "out"
    both = index(out, fake_model, tmp_path / "l1", "gs://bkt/p/a.parquet", at(LOCAL, "gs://bkt/p/a.parquet"))
    assert both.exit_code == 0, both.output
    assert shards(out) == [("gs+http://127.0.0.1:4443/bkt/p/a.parquet", 3), ("gs://bkt/p/a.parquet", 2)]
    ids += put(tmp_path / "other", "bkt/p/a.parquet", "six", 1)
    third = index(out, fake_model, tmp_path / "l2", at(OTHER, "gs://bkt/p/a.parquet"))
    assert third.exit_code == 0, third.output
    assert embedded_ids(tmp_path / "l2") == ["six-0"]
    assert len(shards(out)) == 3
    texts = shown_texts(out, tmp_path)
    assert sorted(texts) == sorted(ids) and all(texts[i] is not None for i in texts), texts


def test_a_public_bucket_read_anonymously_is_read_so_again(fake_model, tmp_path, monkeypatch):
    """No credentials in the chain: only gs://anonymous@ reaches the bucket, at the run and at every search."""
    connections = emulate_gcs(monkeypatch, {"": tmp_path / "google"}, credentials=False)
    ids = put(tmp_path / "google", "public/p/a.parquet", "pub", 3)
    out, log = tmp_path / "out", tmp_path / "log"
    result = index(out, fake_model, log, "gs://anonymous@public/p/")
    assert result.exit_code == 0, result.output
    assert shards(out) == [("gs://anonymous@public/p/a.parquet", 3)]
    texts = shown_texts(out, tmp_path)
    assert texts == {i: f"pub document {i[-1]} edition 0" for i in ids}, texts
    reader = IndexReader(out)
    hits = [row[0] for row in reader.search(reader.index.reconstruct_n(0, reader.ntotal), 1)]
    assert sorted(r["id"] for r in reader.records(hits) if r is not None) == ids
    assert reader.missing_shards == {}, reader.missing_shards
    info = invoke(["info", str(out)])
    assert info.exit_code == 0 and "gs://anonymous@public/p/a.parquet" in info.stdout, info.output
    # --full: the kept object is read anonymously too (no SOURCE in its bucket names it)
    put(tmp_path / "google", "public/q/b.parquet", "q", 2)
    full = index(out, fake_model, tmp_path / "log2", "gs://anonymous@public/q/", "--full")
    assert full.exit_code == 0, full.output
    assert sorted(embedded_ids(tmp_path / "log2")) == sorted([*ids, "q-0", "q-1"])
    assert all(anonymous for _, anonymous in connections), connections
