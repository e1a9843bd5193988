"""[6]-[7] The embedding store and the FAISS index built from it."""

from __future__ import annotations

import numpy as np
import pytest

from petal.pipeline.config import IndexSettings, ReadConfig
from petal.pipeline.index.search import IndexReader
from petal.pipeline.index.writer import auto_factory, build_index
from petal.pipeline.ingest.parquet import preflight
from petal.pipeline.layout import OutputDir
from petal.pipeline.manifest import MANIFEST_FILE, Manifest
from petal.pipeline.reliability.errors import BadInputError
from petal.pipeline.store.embeddings import EmbeddingStore, StoreSink, settings_fingerprint

SETTINGS = {"model": "test", "dim": 8}


def unit_rows(n: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def commit_shard(store, info, vectors, ids, rejects=()):
    fp = store.fingerprint(info, settings_fingerprint(SETTINGS))
    sink = StoreSink(store, [info], [fp], SETTINGS, vectors.shape[1])
    rows = [r for r in range(info.num_rows) if r not in {r for r, _ in rejects}]
    assert sink.expect(0, len(rows), list(rejects), [], final=True) == []
    keys = [(0, r, ids[r]) for r in rows]
    committed = sink.add(keys, vectors[rows])
    assert len(committed) == 1
    return committed[0][1]


@pytest.fixture
def store(tmp_path):
    s = EmbeddingStore(tmp_path / "store")
    s.open()
    return s


def test_store_commit_is_atomic_and_reusable(store, shard_writer):
    path = shard_writer("a.parquet", {"id": ["x", "y", "z"], "text": ["1", "2", "3"]})
    info = preflight([path], ReadConfig())[0]
    vectors = unit_rows(3, 8, 0)
    entry = commit_shard(store, info, vectors, ["x", "y", "z"], rejects=[(1, "empty_text")])
    assert not any(store.tmp_dir.iterdir())  # nothing left half-written
    assert entry.num_embedded == 2 and entry.meta["counts"]["skipped"] == {"empty_text": 1}
    np.testing.assert_array_equal(entry.embeddings()[[0, 2]], vectors[[0, 2]])
    assert entry.rows().to_pydict() == {"row": [0, 2], "id": ["x", "z"]}
    fp = store.fingerprint(info, settings_fingerprint(SETTINGS))
    assert store.lookup(info, fp) == entry
    assert store.lookup(info, store.fingerprint(info, settings_fingerprint({**SETTINGS, "dim": 9}))) is None
    path.write_bytes(path.read_bytes())  # same content, new mtime: same fingerprint after re-hashing
    info2 = preflight([path], ReadConfig())[0]
    assert store.fingerprint(info2, settings_fingerprint(SETTINGS)) == fp


def test_uncommitted_writer_leaves_no_entry(store, shard_writer):
    info = preflight([shard_writer("a.parquet", {"id": [1, 2], "text": ["a", "b"]})], ReadConfig())[0]
    fp = store.fingerprint(info, settings_fingerprint(SETTINGS))
    sink = StoreSink(store, [info], [fp], SETTINGS, 8)
    sink.expect(0, 2, [], [], final=False)
    assert sink.add([(0, 0, 1)], unit_rows(1, 8, 1)) == []  # one row still missing
    sink.abort()
    assert store.lookup(info, fp) is None and not any(store.tmp_dir.iterdir())


def test_non_finite_vectors_are_rejected(store, shard_writer):
    info = preflight([shard_writer("a.parquet", {"id": [1, 2], "text": ["a", "b"]})], ReadConfig())[0]
    vectors = unit_rows(2, 8, 2)
    vectors[1, 3] = np.nan
    entry = commit_shard(store, info, vectors, [1, 2])
    assert entry.num_embedded == 1 and entry.meta["counts"]["skipped"] == {"non_finite_embedding": 1}


def build(store, shard_writer, tmp_path, shards, settings=None):
    settings = settings or IndexSettings()
    entries = []
    for name, ids, vectors in shards:
        info = preflight([shard_writer(name, {"id": ids, "text": ["t"] * len(ids)})], ReadConfig())[0]
        entries.append(commit_shard(store, info, vectors, ids))
    out = OutputDir(tmp_path / "out")
    out.prepare()
    staging = out.staging_dir()
    result = build_index(entries, entries[0].meta["dim"], settings, staging)
    version = out.new_version_id()
    Manifest.bare(result.record(settings), entries[0].meta["dim"], version=version).write(staging / MANIFEST_FILE)
    out.publish(staging, version)
    return result, IndexReader(out.root)


def test_exact_index_finds_every_document_itself(store, shard_writer, tmp_path):
    a, b = unit_rows(300, 32, 3), unit_rows(200, 32, 4)
    ids_a, ids_b = [f"a{i}" for i in range(300)], [f"b{i}" for i in range(200)]
    result, reader = build(store, shard_writer, tmp_path, [("a.parquet", ids_a, a), ("b.parquet", ids_b, b)])
    assert result.factory == "Flat" and result.num_vectors == 500 and reader.ntotal == 500
    hits = reader.search(np.concatenate([a, b]), k=1)
    assert [h[0].id for h in hits] == ids_a + ids_b  # nearest neighbour is itself; ids round-trip
    assert hits[0][0].shard.endswith("a.parquet") and hits[300][0].row == 0
    assert len(reader.search(a[:2], k=10_000)[0]) == 500  # k > size: what there is


def test_duplicate_ids_across_shards_keep_the_last(store, shard_writer, tmp_path):
    a, b = unit_rows(3, 16, 5), unit_rows(2, 16, 6)
    result, reader = build(store, shard_writer, tmp_path, [("a.parquet", [1, 2, 3], a), ("b.parquet", [2, 9], b)])
    assert result.superseded == 1 and reader.ntotal == 4
    assert sorted(reader.ids.column("id").to_pylist()) == [1, 2, 3, 9]
    hit = reader.search(b[:1], k=1)[0][0]
    assert hit.id == 2 and hit.shard.endswith("b.parquet") and hit.score == pytest.approx(1.0, abs=1e-5)
    superseded = reader.search(a[1:2], k=4)[0]  # shard a's vector for id 2 is gone from the index
    assert all(h.score < 0.999 for h in superseded)
    assert [h.shard for h in superseded if h.id == 2] == [hit.shard]


def test_ivf_path_tunes_nprobe_for_recall(store, shard_writer, tmp_path):
    rng = np.random.default_rng(7)
    centers = rng.standard_normal((40, 32)).astype(np.float32)
    x = centers[rng.integers(0, 40, 6000)] + 0.3 * rng.standard_normal((6000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    settings = IndexSettings(flat_max_vectors=1000)
    assert auto_factory(6000, 32, settings).startswith("IVF")
    result, reader = build(store, shard_writer, tmp_path, [("c.parquet", list(range(6000)), x)], settings)
    assert result.factory == "IVF128,Flat"
    assert result.tuning.recall_at_10 >= 0.95 and reader.search_params["nprobe"] >= 1
    queries = x[rng.choice(6000, 200, replace=False)]
    exact = queries @ x.T
    truth = np.argsort(-exact, axis=1)[:, :10]
    found = reader.search(queries, 10)
    recall = np.mean([len({h.faiss_id for h in f} & set(t)) / 10 for f, t in zip(found, truth)])
    assert recall >= 0.9  # measured independently of the build's own tuning


def test_tampered_index_is_refused(store, shard_writer, tmp_path):
    build(store, shard_writer, tmp_path, [("a.parquet", [1, 2], unit_rows(2, 8, 8))])
    out = OutputDir(tmp_path / "out")
    index_file = out.version_dir(out.current_version()) / "index.faiss"
    index_file.write_bytes(index_file.read_bytes() + b"x")
    with pytest.raises(BadInputError, match="does not match the manifest"):
        IndexReader(out.root)


def test_bad_factory_string(store, shard_writer, tmp_path):
    with pytest.raises(ValueError, match="not a valid FAISS factory"):
        build(store, shard_writer, tmp_path, [("a.parquet", [1], unit_rows(1, 8, 9))], IndexSettings(factory="Nope"))


def test_deferred_identity_is_resolved_once_before_the_first_commit(store, shard_writer):
    """A fresh output's store fingerprints wait for the weights' sha256: the sink takes its writers' rows
    first and asks for the identity only when a shard is ready to commit; a failure then commits nothing."""
    from petal.pipeline.store.embeddings import DeferredIdentity

    paths = [shard_writer(f"{name}.parquet", {"id": [f"{name}{i}" for i in range(3)], "text": ["t"] * 3})
             for name in ("a", "b")]
    infos = preflight(paths, ReadConfig())
    vectors = unit_rows(3, 8, 1)
    calls: list[int] = []

    def resolve():
        calls.append(1)
        return [store.fingerprint(info, settings_fingerprint(SETTINGS)) for info in infos], SETTINGS

    sink = StoreSink(store, infos, DeferredIdentity(resolve), None, 8)
    assert sink.expect(0, 3, [], [], final=True) == [] and sink.expect(1, 3, [], [], final=True) == []
    assert sink.add([(0, 0, "a0"), (0, 1, "a1")], vectors[:2]) == [] and calls == []  # not ready: not asked
    first = sink.add([(0, 2, "a2")], vectors[2:])
    assert calls == [1] and [p for p, _ in first] == [0]
    second = sink.add([(1, r, f"b{r}") for r in range(3)], vectors)
    assert calls == [1] and [p for p, _ in second] == [1]  # resolved once, for every writer
    for info, (_, entry) in zip(infos, first + second):
        assert store.lookup(info, store.fingerprint(info, settings_fingerprint(SETTINGS))) == entry
        assert entry.meta["settings"] == SETTINGS

    def refuse():
        raise RuntimeError("the weights changed")

    failing = StoreSink(store, infos[:1], DeferredIdentity(refuse), None, 8)
    failing.expect(0, 3, [], [], final=True)
    with pytest.raises(RuntimeError, match="weights changed"):
        failing.add([(0, r, f"a{r}") for r in range(3)], vectors)
    failing.abort()
    assert not any(store.tmp_dir.iterdir())  # the refused shard left nothing behind
