"""A source shard (or ``--delete`` file) whose column decodes to fewer rows than its footer counts: pyarrow skips a
data page whose header names an unknown page type without an error (``pipeline/reliability/parquet_rows.py``). Every
reader that numbers rows by position refuses it (65 naming the file, the row group and the column): ``petal embed
--input`` embedded the rows left and numbered them wrong at exit 0; a ``--delete`` file lost the ids of the skipped
page. Real Parquet, real ``petal`` commands (the fake engine for the index runs, the packaged model for embed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from tests._parquet_pages import skip_page
from tests.fake_cli import invoke as fake_invoke
from tests.fake_engine import make_fake_model_dir

PETAL = str(Path(sys.executable).parent / "petal")
ROWS, GROUP = 60, 20  # 3 row groups


def shard(path: Path, id_column: bool = False, vectors: bool = False) -> Path:
    """``ROWS`` texts (and ids, vectors) in row groups of ``GROUP``, one data page per column chunk, no id column
    unless ``id_column``: row positions are the ids."""
    columns: dict[str, pa.Array] = {"text": pa.array([f"document {i} about glaciers and {i % 7} rivers"
                                                      for i in range(ROWS)])}
    if id_column:
        columns = {"id": pa.array(range(ROWS), pa.int64()), **columns}
    if vectors:
        flat = np.random.default_rng(0).standard_normal((ROWS, 8)).astype(np.float32).reshape(-1)
        columns["emb"] = pa.FixedSizeListArray.from_arrays(pa.array(flat), 8)
    pq.write_table(pa.table(columns), path, row_group_size=GROUP, use_dictionary=False, write_page_checksum=True)
    return path


def test_embed_input_refuses_a_shard_whose_text_page_is_skipped(tmp_path):
    source = shard(tmp_path / "in.parquet")
    skip_page(source, 1, "text")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PETAL_FAULT", None)
    done = subprocess.run([PETAL, "embed", "--input", str(source), "--output", str(tmp_path / "e.npy")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 65, done.stderr
    assert "in.parquet" in done.stderr and "row group 1, column 'text'" in done.stderr, done.stderr
    assert "footer counts 20" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "e.npy").exists()


@pytest.mark.parametrize("column, flags", [("text", []), ("emb", ["--vectors-column", "emb"])])
def test_index_refuses_a_shard_whose_page_is_skipped_naming_group_and_column(tmp_path, column, flags):
    data = tmp_path / "data"
    data.mkdir()
    source = shard(data / "a.parquet", vectors=bool(flags))
    skip_page(source, 2, column)
    model = make_fake_model_dir(tmp_path / "model")
    argv = ["index", str(data), "--out", str(tmp_path / "out"), "-q", *flags]
    result = fake_invoke(argv if flags else [*argv, "--model", str(model)],
                         env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "fake.jsonl")})
    assert result.exit_code == 65, result.output
    assert "a.parquet" in result.output and f"row group 2, column {column!r}" in result.output, result.output
    assert "footer counts 20" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out" / "CURRENT").exists()


def test_a_delete_file_whose_page_is_skipped_deletes_nothing(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    shard(data / "a.parquet", id_column=True, vectors=True)
    out = tmp_path / "out"
    base = ["index", str(data), "--out", str(out), "--vectors-column", "emb", "-q"]
    assert fake_invoke(base).exit_code == 0
    deletes = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": pa.array(range(ROWS), pa.int64())}), deletes, row_group_size=GROUP,
                   use_dictionary=False)
    skip_page(deletes, 0, "id")  # 40 ids left to a read that trusts it: 40 of the 60 deleted
    report = tmp_path / "report.json"
    result = fake_invoke([*base, "--delete", str(deletes), "--json-report", str(report)])
    assert result.exit_code == 65, result.output
    assert "d.parquet" in result.output and "footer counts" in result.output, result.output
    assert json.loads(report.read_text())["status"] == "failed"
    assert IndexReader(out).ids.num_rows == ROWS  # the live version still holds every row
