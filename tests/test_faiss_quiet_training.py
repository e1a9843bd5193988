"""An IVF trained on fewer than FAISS's 39 points a list (a memory budget caps the sample at petal's floor of 30:
``writer.training_size``) built without FAISS's k-means printing "WARNING clustering N points to K centroids" on
stderr: a stray line no "petal:" prefix names, in every unattended run's log. A sample below petal's own floor
(a small store, a factory with more lists or finer codes than it can train) is warned about in petal's words, through
``say`` (the ``petal`` logger under ``quiet=True``): before, FAISS's own line reached stderr whatever ``quiet`` asked
(``petal.rebuild(OUT, index_factory="IVF16,Flat", quiet=True)`` on 342 vectors), 409 of them for an OPQ rotation's."""

from __future__ import annotations

import json
import logging

import pytest
from click.testing import CliRunner

import petal
from petal.cli.main import cli
from tests._open_audit_shared import vectors_shard
from tests.conftest import REPO
from tests.fake_engine import fake_engine_factory


@pytest.mark.parametrize("extra", [[], ["--index-factory", "IVF512,Flat"]])
def test_an_ivf_trained_at_petals_floor_prints_no_faiss_warning(tmp_path, capfd, extra):
    vectors_shard(tmp_path / "v.parquet", rows=20000, dim=64, seed=0)
    argv = ["index", str(tmp_path / "v.parquet"), "--vectors-column", "emb", "--out", str(tmp_path / "out"), "-q",
            "--index-memory", "2M", "--json-report", str(tmp_path / "report.json"), *extra]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "report.json").read_text())
    factory = report["index"]["factory"]
    assert "IVF" in factory, factory
    captured = capfd.readouterr()
    assert "WARNING clustering" not in captured.err + captured.out, factory


def test_a_quiet_index_and_rebuild_too_small_for_the_factory_write_nothing_and_log_petals_warning(tmp_path, capfd,
                                                                                                caplog):
    """The README's rebuild example on the sample data: 342 vectors for 16 lists, 21 a list."""
    caplog.set_level(logging.INFO, logger="petal")
    out = tmp_path / "out"
    petal.index(REPO / "sample_data", out, engine_factory=fake_engine_factory(None), quiet=True)
    capfd.readouterr()
    report = petal.rebuild(out, index_factory="IVF16,Flat", quiet=True)
    assert capfd.readouterr() == ("", "")  # was "WARNING clustering 342 points to 16 centroids: please provide ..."
    assert report.index["factory"] == "IVF16,Flat" and report.index["device"]["train_points"] == 342
    logged = [r.getMessage() for r in caplog.records if r.name == "petal" and r.levelno == logging.WARNING]
    assert logged == ["warning: the 'IVF16,Flat' index trained its k-means on too few vectors (fewer than 30 a "
                      "centroid): 16 IVF lists: 21 each (of 342 vectors); centroids placed from so few vectors cost "
                      "recall and speed: give at most 11 lists (IVF11), --index-factory auto, or index more vectors"]


@pytest.mark.parametrize(("factory", "said"), [
    ("IVF32,PQ4", ["32 IVF lists: 18 each", "256 centroids per PQ sub-quantizer: 2 each",
                   "at most 20 lists (IVF20) and codes of at most 4 bits (x4)"]),
    ("IVF8,PQ4x4", []),  # 75 a list, 37 a centroid: enough, and nothing said
    # FAISS printed 200 lines (4 sub-quantizers a round, 50 rounds): the rotation's own PQ is 8 bits, whatever follows
    ("OPQ4,IVF8,PQ4x4", ["256 centroids per sub-quantizer of the OPQ rotation's PQ: 2 each",
                         "give no OPQ rotation (its PQ takes 8 bits: 7680 vectors)"]),
    ("RQ2x6", ["64 centroids per residual quantizer step: 9 each", "codes of at most 4 bits (x4)"]),
    ("IVF16(PQ2x4),Flat", ["the coarse quantizer's 16 centroids per PQ sub-quantizer: 1 each (of 16 vectors)",
                           "give a flat or HNSW coarse quantizer"]),  # trained on the 16 list centroids
])
def test_the_cli_says_petals_warning_once_and_never_faiss_s(tmp_path, capfd, factory, said):
    vectors_shard(tmp_path / "v.parquet", rows=600, dim=16, seed=0)
    argv = ["index", str(tmp_path / "v.parquet"), "--vectors-column", "emb", "--out", str(tmp_path / "out"), "-q",
            "--metric", "l2", "--index-factory", factory]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    err = capfd.readouterr().err + result.stderr
    assert "WARNING" not in err and "please provide" not in err, err
    warnings = [line for line in err.splitlines() if "trained its k-means" in line]
    assert len(warnings) == (1 if said else 0), err
    for words in said:
        assert words in warnings[0], warnings[0]
    assert all(line.startswith("petal") for line in err.splitlines()), err


def test_a_thin_fast_scan_pq_is_never_told_to_take_fewer_bits(tmp_path, capfd):
    """Fast-scan PQ takes 4-bit codes only: "codes of at most 4 bits (x3)" named a factory FAISS cannot parse."""
    vectors_shard(tmp_path / "v.parquet", rows=300, dim=16, seed=0)
    argv = ["index", str(tmp_path / "v.parquet"), "--vectors-column", "emb", "--out", str(tmp_path / "out"), "-q",
            "--metric", "l2", "--index-factory", "IVF8,PQ4x4fs"]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    warnings = [line for line in (capfd.readouterr().err + result.stderr).splitlines() if "trained its k-means" in line]
    assert len(warnings) == 1, warnings
    assert "no fast-scan PQ (its 4-bit codes need 480 vectors)" in warnings[0] and "bits (x" not in warnings[0]
