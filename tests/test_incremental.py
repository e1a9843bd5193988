"""Re-indexing: only new and changed shards are embedded, the result equals a full rebuild,
index-only changes never re-embed, and ``petal rebuild`` needs no model.

The engine is the tests' fake (tests/fake_engine.py: a hash of each sequence's token ids), which
logs every document it is handed; everything else (Parquet, tokenizer, packer, store, FAISS) is real.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.config import IndexJob, IndexSettings, ReadConfig
from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.search import IndexReader
from petal.pipeline.jobs.index_run import run_index
from petal.pipeline.jobs.removals import RemovalLimit
from petal.pipeline.jobs.report import RunReport
from tests.fake_engine import embedded_ids, fake_engine_factory


def write(data: Path, name: str, docs: dict[str, str]) -> None:
    pq.write_table(pa.table({"id": list(docs), "text": list(docs.values())}), data / name)


def docs(prefix: str, n: int) -> dict[str, str]:
    return {f"{prefix}-{i}": f"document {i} of shard {prefix} about topic {i % 7}" for i in range(n)}


@pytest.fixture
def model_dir(tiny_bert_dir, tmp_path) -> Path:
    """A private copy of the tiny model, so a test can delete it."""
    return Path(shutil.copytree(tiny_bert_dir, tmp_path / "model"))


def index(data: Path, out: Path, model_dir: Path, log: list, full: bool = False, sync: bool = False,
          max_removed: RemovalLimit | None = None, **settings) -> RunReport:
    """One run with the fake engine; ``log`` gains the ids of every document it embedded."""
    job = IndexJob(sources=(str(data),), out=out, model=str(model_dir), read=ReadConfig(),
                   index=IndexSettings(**settings), quiet=True, full=full, sync=sync, max_removed=max_removed)
    engine_log = out.parent / f"{out.name}-engine-{uuid.uuid4().hex[:8]}.jsonl"
    report = run_index(job, RunReport(), engine_factory=fake_engine_factory(engine_log))
    log.extend(embedded_ids(engine_log))
    return report


def contents(out: Path) -> tuple[list[dict], np.ndarray]:
    """``ids.parquet`` rows and the indexed vectors (FAISS id order), read back from the version."""
    reader = IndexReader(out)
    index = load_faiss().downcast_index(reader.index)
    vectors = index.reconstruct_n(0, index.ntotal)
    rows = reader.ids.select(["faiss_id", "id", "row"]).to_pylist()
    shards = [Path(s).name for s in reader.ids.column("shard").to_pylist()]
    return [{**r, "shard": s} for r, s in zip(rows, shards)], vectors


def test_only_changed_shards_are_embedded_and_equal_a_full_rebuild(model_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    a, b, c, d = docs("a", 20), docs("b", 20), docs("c", 20), docs("d", 20)
    for name, shard in (("a", a), ("b", b), ("c", c), ("d", d)):
        write(data, f"{name}.parquet", shard)
    out, log = tmp_path / "out", []
    first = index(data, out, model_dir, log)
    assert first.status == "success" and len(log) == 80 and first.shard_changes["added"] == [
        str(data / f"{n}.parquet") for n in "abcd"]

    # b: one text changed, one row removed; c: removed; e: new, and takes over a-3 (moved, new text)
    b2 = dict(b)
    b2["b-5"] = "a rewritten document"
    del b2["b-9"]
    write(data, "b.parquet", b2)
    (data / "c.parquet").unlink()
    e = {"a-3": "this document moved to shard e", **docs("e", 5)}
    write(data, "e.parquet", e)
    log.clear()
    # --sync: the index mirrors the directory (c is dropped: 20 of 80 documents, over the default 10%)
    second = index(data, out, model_dir, log, sync=True, max_removed=RemovalLimit(fraction=0.3))
    assert sorted(log) == sorted([*b2, *e])  # nothing else went through the engine
    assert second.shards == {"total": 4, "embedded": 2, "reused": 2}
    assert second.removed["documents"] == 20 and second.removed["replaced"] == 1
    assert second.removed["shards"] == [str(data / "c.parquet")]
    assert {k: [Path(p).name for p in v] for k, v in second.shard_changes.items()} == {
        "added": ["e.parquet"], "changed": ["b.parquet"], "removed": ["c.parquet"],
        "unchanged": ["a.parquet", "d.parquet"]}
    rows, vectors = contents(out)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == 19 + 19 + 20 + 6  # a (a-3 superseded), b, d, e: a-3 once
    assert not any(i.startswith("c-") for i in ids) and "b-9" not in ids
    assert [r["shard"] for r in rows if r["id"] == "a-3"] == ["e.parquet"]  # the last shard wins

    full_log: list = []
    full = index(data, tmp_path / "full", model_dir, full_log, full=True)
    assert full.shards["embedded"] == 4 and len(full_log) == len(ids) + 1  # a-3 embedded in a and in e
    full_rows, full_vectors = contents(tmp_path / "full")
    assert full_rows == rows
    np.testing.assert_array_equal(full_vectors, vectors)

    log.clear()
    third = index(data, out, model_dir, log)
    assert third.status == "nothing-to-do" and third.version == second.version and log == []

    fourth = index(data, out, model_dir, log, factory="IVF4,Flat")  # only the index type changed
    assert fourth.status == "success" and log == [] and fourth.shards["embedded"] == 0
    assert fourth.version != second.version and fourth.index["factory"] == "IVF4,Flat"
    assert sorted(r["id"] for r in contents(out)[0]) == sorted(ids)


def test_rebuild_needs_no_model(model_dir, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name in "ab":
        write(data, f"{name}.parquet", docs(name, 60))
    out, log = tmp_path / "out", []
    first = index(data, out, model_dir, log)
    shutil.rmtree(model_dir)  # rebuild reads the store only
    report = tmp_path / "rebuild.json"
    runner = CliRunner()
    result = runner.invoke(cli, ["rebuild", str(out), "--index-factory", "IVF8,Flat", "--target-recall", "0.9",
                                 "--json-report", str(report)])
    assert result.exit_code == 0, result.output
    summary = json.loads(report.read_text())
    assert summary["status"] == "success" and summary["version"] != first.version
    assert summary["rows"]["embedded"] == 0 and summary["rows"]["reused"] == 120  # nothing embedded: all from the store
    manifest = json.loads((out / "versions" / summary["version"] / "manifest.json").read_text())
    assert manifest["rebuilt_from"] == first.version and manifest["index"]["factory"] == "IVF8,Flat"
    assert manifest["shards"] == json.loads((out / "versions" / first.version / "manifest.json").read_text())[
        "shards"]
    nprobe = manifest["index"]["search_params"]["nprobe"]
    assert manifest["index"]["tuning"]["recall_at_10"] >= 0.9
    assert IndexReader(out).manifest.rebuilt_from == first.version
    info = runner.invoke(cli, ["info", str(out)])
    assert info.exit_code == 0 and f"'nprobe': {nprobe}" in info.stdout and "recall@10" in info.stdout
    assert "rebuilt" in info.stdout
    bad = runner.invoke(cli, ["rebuild", str(out), "--index-factory", "IVF8,Nope"])
    assert bad.exit_code == 2 and "not a valid FAISS factory" in bad.output
    assert runner.invoke(cli, ["rebuild", str(tmp_path / "nothing")]).exit_code == 78
    assert runner.invoke(cli, ["rebuild", str(out), "--index-memory", "lots"]).exit_code == 2
    shutil.rmtree(out / "store")
    gone = runner.invoke(cli, ["rebuild", str(out)])
    assert gone.exit_code == 78 and "no committed embeddings" in gone.output
