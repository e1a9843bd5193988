"""An IVF trained on fewer than FAISS's 39 points a list (a memory budget caps the sample at petal's floor of 30:
``writer.training_size``) built without FAISS's k-means printing "WARNING clustering N points to K centroids" on
stderr: a stray line no "petal:" prefix names, in every unattended run's log. A sample below petal's own floor
still warns (nothing hides a training that bad)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests._open_audit_shared import vectors_shard


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
