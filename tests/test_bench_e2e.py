"""``petal bench e2e`` on the CPU with a tiny real model, through the CLI: one petal run per tokenize-worker
setting, each paired with its own tokenizer-only run (structure and consistency only; no speed asserted)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from click.testing import CliRunner

from petal.cli.main import cli
from tests.conftest import SAMPLE_DATA


def test_e2e_bench_pairs_each_run_with_tokenizer_only(tiny_bert_dir: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the bench's work directory goes under tmp_path
    result = CliRunner().invoke(cli, ["bench", "e2e", "--model", str(tiny_bert_dir), "--corpus", str(SAMPLE_DATA),
                                      "--docs", "240", "--device", "cpu", "--no-baseline", "--tokenize-workers", "2,1",
                                      "--json"])
    assert result.exit_code == 0, result.output
    bench = json.loads(result.stdout)
    assert [run["tokenize_workers"] for run in bench["runs"]] == [2, 1]
    assert bench["docs"] == 240
    assert not list(tmp_path.glob("petal-*")), list(tmp_path.iterdir())  # its work directory removed at the end
    for run in bench["runs"]:
        report = run["petal_report"]
        assert report["status"] == "success" and report["rows"]["embedded"] == 240
        assert report["tokens"] == bench["tokens"]  # petal tokenized what the corpus holds
        ratio = run["petal_tokens_per_s"] / run["tokenizer_only_tokens_per_s"]
        assert abs(run["fraction_of_tokenizer_only"] - ratio) < 1e-9
        timings = report["timings_s"]
        assert timings["embed_wait_tokens"] + timings["embed_wait_device"] <= timings["embed"]
        stats = report["engine"]["stats"]
        assert 0 < stats["first_step_s"] <= stats["host_step_s"]
        assert report["index"]["num_vectors"] == 240
    assert bench["petal_seconds"] == bench["runs"][0]["petal_seconds"]


def test_e2e_bench_through_the_worker_pool(tiny_bert_dir: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    table = CliRunner().invoke(cli, ["bench", "e2e", "--model", str(tiny_bert_dir), "--corpus", str(SAMPLE_DATA),
                                     "--docs", "120", "--device", "cpu", "--no-baseline", "--workers", "1", "--json"])
    assert table.exit_code == 0, table.output
    bench = json.loads(table.stdout)
    report = bench["runs"][0]["petal_report"]
    assert report["status"] == "success" and report["rows"]["embedded"] == 120
    assert [w["status"] for w in report["workers"]] == ["done"] and report["tokens"] == bench["tokens"]


def test_e2e_bench_side_by_side_over_corpus_sizes(tiny_bert_dir: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    table = CliRunner().invoke(cli, ["bench", "e2e", "--model", str(tiny_bert_dir), "--corpus", str(SAMPLE_DATA),
                                     "--docs", "120,150", "--device", "cpu", "--no-baseline",
                                     "--index-factory", "auto"])
    assert table.exit_code == 0, table.output
    rows = [line for line in table.stdout.splitlines() if line.startswith("| 1")]
    assert [row.split("|")[1].strip() for row in rows] == ["120", "150"]
    assert "weights_sha256_wait" in rows[0] and "preflight" in rows[0]  # the serial parts, side by side
    # engine T2 not measured on the CPU: "-" (was "nank", NaN formatted as thousands)
    assert [row.split("|")[3].strip() for row in rows] == ["-", "-"] and "nan" not in table.stdout.lower()
    assert table.stdout.count("  index stage ") == 2 and table.stdout.count("not overlapped") == 3
    bad = CliRunner().invoke(cli, ["bench", "e2e", "--docs", "120,x", "--device", "cpu"])
    assert bad.exit_code == 2 and "--docs" in bad.output
