"""``petal index`` keeps the live version's index settings where no flag asks for others, as ``petal rebuild`` does:
the factory asked for (``auto`` stays ``auto``), the metric, the memory budget, the target recall, the seed.

Before, every index flag not given took its default: after ``petal rebuild OUT --metric l2`` the next cron run
(``petal index SOURCES --out OUT``, no ``--metric``) published an ip version again, silently (the scores changed
meaning under its readers); an ``--index-factory HNSW16`` given once became ``auto`` (Flat) on the next run without
it, and ``--index-memory``/``--target-recall`` were lost the same way. A flag given wins; a first run gets the
defaults; ``--full`` keeps them (it re-embeds, the index the user chose stays). Real ``petal`` processes, real
Parquet and FAISS (``--vectors-column`` for speed, the packaged model once); the Python API alike.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.config import IndexSettings
from tests import forkrun

DIM = 8
DEFAULTS = IndexSettings().as_dict()


def petal_run(*argv: object, rc: int = 0) -> forkrun.Result:
    """``petal ARGV`` in its own process (forked from the preloaded forkserver)."""
    proc = forkrun.petal(list(map(str, argv)), timeout=300)
    assert proc.rc == rc and "Traceback" not in proc.stderr, (argv, proc.rc, proc.stderr[-3000:])
    return proc


def settings(out: Path) -> dict:
    """The live version's index settings, as its manifest records them (``petal info``)."""
    return json.loads(petal_run("info", out, "--json").stdout)["index"]["settings"]


def index(data: Path, out: Path, *flags: object, shards: tuple[str, ...] = ("a",)) -> dict:
    """``petal index`` of ``shards`` (vectors column) into ``out``; its report."""
    proc = petal_run("index", *(data / f"{s}.parquet" for s in shards), "--out", out, "-q", "--vectors-column", "emb",
                     "--json", *flags)
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("keep")
    for name, start, rows in (("a", 0, 300), ("b", 300, 40), ("small", 1000, 20)):
        flat = np.random.default_rng(start).standard_normal((rows, DIM)).astype(np.float32).ravel()
        pq.write_table(pa.table({"id": np.arange(start, start + rows),
                                 "text": [f"document number {i} about topic {i % 7}" for i in range(rows)],
                                 "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                       root / f"{name}.parquet")
    return root


def test_a_first_run_gets_the_defaults(data, tmp_path):
    report = index(data, tmp_path / "out")
    assert report["index"]["settings"] == DEFAULTS
    assert settings(tmp_path / "out") == DEFAULTS


def test_the_next_run_keeps_what_a_rebuild_chose(data, tmp_path):
    out = tmp_path / "out"
    index(data, out)
    petal_run("rebuild", out, "--metric", "l2", "--index-memory", "100M", "--target-recall", "0.9")
    chosen = {**DEFAULTS, "metric": "l2", "memory_bytes": 100 << 20, "target_recall": 0.9}
    assert settings(out) == chosen
    same = index(data, out)  # the cron run, no index flag: nothing changed, the live version stays
    assert same["status"] == "nothing-to-do"
    report = index(data, out, shards=("a", "b"))  # a new shard: a new version, l2 as the live one
    assert report["status"] == "success" and report["index"]["metric"] == "l2"
    assert report["index"]["settings"] == chosen and settings(out) == chosen
    full = index(data, out, "--full", shards=("a", "b"))  # --full re-embeds; the index the user chose stays
    assert full["status"] == "success" and settings(out) == chosen
    petal_run("verify", out)


def test_the_next_run_keeps_a_factory_given_once(data, tmp_path):
    out = tmp_path / "out"
    index(data, out, "--index-factory", "HNSW16", "--metric", "l2")
    report = index(data, out, shards=("a", "b"))
    assert (report["index"]["factory"], report["index"]["requested_factory"]) == ("HNSW16", "HNSW16")
    assert settings(out) == {**DEFAULTS, "factory": "HNSW16", "metric": "l2"}
    index(data, out, "--index-factory", "auto", shards=("a", "b"))  # asked for: by size again, and kept so
    index(data, out, shards=("a", "b", "small"))
    info = json.loads(petal_run("info", out, "--json").stdout)["index"]
    assert (info["factory"], info["requested_factory"], info["settings"]["metric"]) == ("Flat", "auto", "l2")


def test_a_flag_given_wins(data, tmp_path):
    out = tmp_path / "out"
    index(data, out, "--metric", "l2", "--target-recall", "0.9", "--index-factory", "HNSW16")
    report = index(data, out, "--metric", "ip")  # only the metric changes
    assert report["status"] == "success" and report["index"]["metric"] == "ip"
    assert settings(out) == {**DEFAULTS, "factory": "HNSW16", "target_recall": 0.9}


def test_a_kept_factory_that_cannot_be_built_names_the_live_version(data, tmp_path):
    """``IVF64,Flat`` of 300 vectors, then a ``--sync`` run down to 20: the kept factory cannot train (78 naming the
    live manifest and the way out, nothing published); the same factory given is a usage error (2)."""
    out = tmp_path / "out"
    index(data, out, "--index-factory", "IVF64,Flat")
    before = settings(out)
    proc = petal_run("index", data / "small.parquet", "--out", out, "-q", "--vectors-column", "emb", "--sync",
                     "--max-removed", "100%", rc=78)
    assert "IVF64,Flat" in proc.stderr and "manifest.json" in proc.stderr and "give --index-factory" in proc.stderr
    assert settings(out) == before
    petal_run("index", data / "small.parquet", "--out", out, "-q", "--vectors-column", "emb", "--sync",
              "--max-removed", "100%", "--index-factory", "IVF64,Flat", rc=2)
    petal_run("index", data / "small.parquet", "--out", out, "-q", "--vectors-column", "emb", "--sync",
              "--max-removed", "100%", "--index-factory", "auto")
    assert settings(out) == {**DEFAULTS, "factory": "auto"}


def test_a_text_run_keeps_them_too(data, tmp_path):
    """The packaged model's run (pipeline/jobs/index_run.py), as the vectors column's."""
    out = tmp_path / "out"
    petal_run("index", data / "small.parquet", "--out", out, "-q", "--device", "cpu", "--metric", "l2")
    petal_run("rebuild", out, "--index-factory", "HNSW8", "--target-recall", "0.9")
    shutil.copyfile(data / "small.parquet", tmp_path / "copy.parquet")  # a new shard (the same rows, other ids)
    pq.write_table(pq.read_table(tmp_path / "copy.parquet").set_column(0, "id", pa.array(np.arange(20) + 5000)),
                   tmp_path / "copy.parquet")
    proc = petal_run("index", data / "small.parquet", tmp_path / "copy.parquet", "--out", out, "-q", "--device", "cpu",
                     "--json")
    report = json.loads(proc.stdout)
    assert report["status"] == "success" and report["index"]["factory"] == "HNSW8"
    assert settings(out) == {**DEFAULTS, "factory": "HNSW8", "metric": "l2", "target_recall": 0.9}


def test_the_api_keeps_them(data, tmp_path):
    out = tmp_path / "out"
    petal.index([data / "a.parquet"], out, vectors_column="emb", quiet=True, metric="l2", index_memory="100M")
    petal.rebuild(out, index_factory="HNSW16")
    report = petal.index([data / "a.parquet", data / "b.parquet"], out, vectors_column="emb", quiet=True,
                         target_recall=0.9)
    chosen = {**DEFAULTS, "factory": "HNSW16", "metric": "l2", "memory_bytes": 100 << 20, "target_recall": 0.9}
    assert report.status == "success" and report.index["settings"] == chosen and settings(out) == chosen
    # the whole section given: all of it wins
    petal.index([data / "a.parquet", data / "b.parquet"], out, vectors_column="emb", quiet=True,
                index=IndexSettings())
    assert settings(out) == DEFAULTS
