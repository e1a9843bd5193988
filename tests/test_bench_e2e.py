"""``petal bench e2e`` on the CPU with a tiny real model: one petal run per tokenize-worker setting,
each paired with its own tokenizer-only run (structure and consistency only; no speed asserted)."""

from __future__ import annotations

from pathlib import Path

import faiss
import pyarrow.parquet as pq

from petal.bench.e2e import format_e2e_table, run_e2e_bench


def test_e2e_bench_pairs_each_run_with_tokenizer_only(tiny_bert_dir: Path, tmp_path: Path):
    result = run_e2e_bench(tiny_bert_dir, Path("sample_data"), 240, "cpu", baseline=False, workdir=tmp_path,
                           tokenize_workers=(2, 1))
    assert [run["tokenize_workers"] for run in result["runs"]] == [2, 1]
    corpus_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in (tmp_path / "corpus").glob("*.parquet"))
    assert corpus_rows == 240
    for number, run in enumerate(result["runs"]):
        report = run["petal_report"]
        assert report["status"] == "success" and report["rows"]["embedded"] == 240
        assert report["tokens"] == result["tokens"]  # petal tokenized what the corpus holds
        ratio = run["petal_tokens_per_s"] / run["tokenizer_only_tokens_per_s"]
        assert abs(run["fraction_of_tokenizer_only"] - ratio) < 1e-9
        timings = report["timings_s"]
        assert timings["embed_wait_tokens"] + timings["embed_wait_device"] <= timings["embed"]
        stats = report["engine"]["stats"]
        assert 0 < stats["first_step_s"] <= stats["host_step_s"]
        index = faiss.read_index(str(next((tmp_path / f"petal-out-{number}").glob("versions/*/index.faiss"))))
        assert index.ntotal == 240
    assert result["petal_seconds"] == result["runs"][0]["petal_seconds"]
    table = format_e2e_table(result)
    assert "[2 tokenize workers]" in table and "petal, 1 tokenize workers" in table


def test_e2e_bench_through_the_worker_pool(tiny_bert_dir: Path, tmp_path: Path):
    from petal.pipeline.config import ScaleConfig

    result = run_e2e_bench(tiny_bert_dir, Path("sample_data"), 120, "cpu", baseline=False, workdir=tmp_path,
                           scale=ScaleConfig(workers=1))
    report = result["runs"][0]["petal_report"]
    assert report["status"] == "success" and report["rows"]["embedded"] == 120
    assert [w["status"] for w in report["workers"]] == ["done"] and report["tokens"] == result["tokens"]
    assert "workers 1" in format_e2e_table(result)
