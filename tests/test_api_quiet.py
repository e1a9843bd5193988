"""``quiet=True`` of the Python API: nothing on the process's stdout or stderr (fds 1 and 2, captured by ``capfd``).

Before, ``petal.index(..., quiet=True)`` hid the progress bar only: its notes and warnings (a version kept for an open
``petal.Index``, an index missing its recall target, a report it could not write) still went to stderr, so an Airflow
task or a web service embedding petal wrote there all the same, and ``petal.rebuild`` took no ``quiet`` at all. They
now go to the ``petal`` logger (and the report keeps its fields); ``petal index -q`` still prints them, as before.
``petal.verify``, ``petal.Index.search`` and ``petal.Embedder`` take no ``quiet``: they say nothing on stderr at all.
Real Parquet, real FAISS, the packaged MiniLM with its real tokenizer."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from tests.fake_cli import invoke

NUM_ROWS = 2000


def _write_vectors(path, seed: int) -> None:
    vectors = np.random.default_rng(seed).standard_normal((NUM_ROWS, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)  # NOTE: SQ8_direct over unit vectors: recall@10 ~0
    pq.write_table(pa.table({"id": np.arange(NUM_ROWS), "emb": pa.array(list(vectors), pa.list_(pa.float32()))}),
                   path)


@pytest.fixture
def held(tmp_path):
    """A vectors index whose live version an open ``petal.Index`` leases: a run keeping 1 version keeps it, noted."""
    shard = tmp_path / "a.parquet"
    _write_vectors(shard, 0)
    first = petal.index(shard, tmp_path / "out", vectors_column="emb", index_factory="Flat", quiet=True).version
    with petal.open_index(tmp_path / "out") as index:
        _write_vectors(shard, 1)
        yield shard, tmp_path / "out", first, index


def _petal_records(caplog) -> str:
    return "\n".join(f"{r.levelname} {r.getMessage()}" for r in caplog.records if r.name == "petal")


@pytest.mark.parametrize("quiet", [True, np.True_], ids=["True", "np.True_"])
def test_index_and_rebuild_quiet_write_nothing_and_log_their_notes(held, capfd, caplog, quiet):
    """NOTE: numpy's True (taken as a bool by the settings) kept the notes on stderr."""
    shard, out, first, _ = held
    caplog.set_level(logging.INFO, logger="petal")
    capfd.readouterr()
    report = petal.index(shard, out, vectors_column="emb", index_factory="SQ8_direct", keep_versions=1, quiet=quiet)
    assert capfd.readouterr() == ("", "")
    assert report.pruned["in_use"] == [first] and report.index["tuning"]["reached"] is False
    logged = _petal_records(caplog)
    assert f"INFO note: kept {first}" in logged, logged
    assert "WARNING warning: the 'SQ8_direct' index reaches recall@10" in logged, logged
    caplog.clear()
    rebuilt = petal.rebuild(out, index_factory="SQ8_direct", target_recall=0.5, keep_versions=1, quiet=quiet)
    assert capfd.readouterr() == ("", "")
    assert rebuilt.index["tuning"]["reached"] is False
    logged = _petal_records(caplog)
    assert f"INFO note: kept {first}" in logged and "below --target-recall 0.5" in logged, logged


def test_not_quiet_still_says_them_on_stderr_and_so_does_the_cli_with_q(held, capfd):
    shard, out, first, _ = held
    capfd.readouterr()
    petal.rebuild(out, index_factory="SQ8_direct", keep_versions=1)
    err = capfd.readouterr().err
    assert f"petal: note: kept {first}" in err and "petal: warning: the 'SQ8_direct' index" in err, err
    result = invoke(["index", str(shard), "--out", str(out), "--vectors-column", "emb", "-q", "--keep-versions", "1",
                     "--index-factory", "SQ8_direct", "--full"])
    assert result.exit_code == 0, result.output
    assert f"petal: note: kept {first}" in result.stderr and "petal: warning: the 'SQ8_direct'" in result.stderr


def test_a_report_quiet_index_cannot_write_is_logged_not_printed(tmp_path, capfd, caplog):
    target = tmp_path / "missing" / "report.json"
    with pytest.raises(petal.UsageError):
        petal.index("", tmp_path / "out", json_report=target, quiet=True)
    assert capfd.readouterr() == ("", "")
    assert "WARNING warning: cannot write the report to" in _petal_records(caplog)


def test_a_quiet_text_run_verify_search_and_embedder_write_nothing(tmp_path, capfd):
    shard = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["glaciers move slowly", "", "rivers carve valleys"]}),
                   shard)
    capfd.readouterr()
    report = petal.index(shard, tmp_path / "out", quiet=True)
    assert report.rows["embedded"] == 2
    assert petal.verify(tmp_path / "out").ok
    with petal.open_index(tmp_path / "out") as index:
        assert index.search(["how do glaciers move", None], k=1)[0][0].id == "a"
    with petal.Embedder() as embedder:
        assert embedder.embed(["a text", " "]).skipped
    assert capfd.readouterr() == ("", "")
