"""Read errors after the footers in ``petal index --vectors-column`` (and the text run's reader they share):
a corrupt page is 65 naming the file, row group and column, an OS read error is retried (counted) and 74 when
it persists; the report is written and nothing is published. Shards are real Parquet files whose footer
still reads, with bytes overwritten inside one column chunk."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.layout import OutputDir
from petal.pipeline.reliability import faults
from tests.fake_cli import fake_hooks
from tests.fake_engine import make_fake_model_dir
from tests.invariants import live

DIM, ROWS, GROUP = 8, 400, 100  # 4 row groups: the damage is in row group 2


def shard(path: Path, prefix: str, fixed: bool = False, checksums: bool = False) -> Path:
    vectors = np.random.default_rng(sum(prefix.encode())).standard_normal((ROWS, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    emb = (pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM) if fixed
           else pa.array(vectors.tolist(), pa.list_(pa.float32())))
    table = pa.table({"id": [f"{prefix}-{i}" for i in range(ROWS)], "emb": emb,
                      "text": [f"{prefix} document {i} about glaciers" for i in range(ROWS)]})
    pq.write_table(table, path, row_group_size=GROUP, compression="none", use_dictionary=False,
                   write_page_checksum=checksums)
    return path


def damage(path: Path, column: str, skip: int) -> None:
    """Overwrite 8 bytes ``skip`` bytes into row group 2's first data page of ``column``; the footer is kept."""
    meta = pq.ParquetFile(path).metadata
    chunk = meta.row_group(2).column(meta.schema.to_arrow_schema().names.index(column))  # one leaf a field
    assert skip + 8 < chunk.total_compressed_size
    data = bytearray(path.read_bytes())
    at = chunk.data_page_offset + skip
    data[at:at + 8] = b"\x7f\xff\x00\xff\x13\x80\xff\xee"
    path.write_bytes(bytes(data))
    pq.read_metadata(path)  # the footer still reads: only the rows phase can find this


def run(*args: str | Path, fault: str | None = None, obj: object = None, monkeypatch: pytest.MonkeyPatch,
        report: Path) -> tuple[int, str, dict]:
    if fault:
        monkeypatch.setenv(faults.FAULT_ENV, fault)
    else:
        monkeypatch.delenv(faults.FAULT_ENV, raising=False)
    monkeypatch.setattr(faults, "_ARMED", faults._Armed())  # hit counters from 0 in this process
    report.unlink(missing_ok=True)
    result = CliRunner().invoke(cli, ["index", *map(str, args), "-q", "--json-report", str(report)], obj=obj)
    assert result.exit_code != 1 and "Traceback" not in result.output, result.output  # never a bug
    return result.exit_code, result.stderr, json.loads(report.read_text())


@pytest.fixture
def vectors_index(tmp_path, monkeypatch):
    """``index(*sources, fault=...)`` with --vectors-column emb into tmp/out (a good shard already live)."""
    out, report = tmp_path / "out", tmp_path / "report.json"

    def index(*sources: Path, fault: str | None = None) -> tuple[int, str, dict]:
        return run(*sources, "--out", out, "--vectors-column", "emb", fault=fault, monkeypatch=monkeypatch,
                   report=report)

    rc, stderr, _ = index(shard(tmp_path / "good.parquet", "good"))
    assert rc == 0, stderr
    index.out = out  # type: ignore[attr-defined]
    return index


# (name, how the shard is written, column damaged, bytes into its page): pyarrow's error for each differs
CORRUPT = [
    ("page header", {}, "emb", 0),  # OSError "Couldn't deserialize thrift" (before: 65 naming no file)
    ("fixed-size list levels", {"fixed": True}, "emb", 60),  # ArrowInvalid (before: exit 1, a traceback)
    ("page data under a checksum", {"checksums": True}, "emb", 300),  # CRC (before: indexed, skips and garbage)
    ("id column page header", {}, "id", 0),
]


@pytest.mark.parametrize("kind, make, column, skip", CORRUPT, ids=[c[0] for c in CORRUPT])
def test_a_corrupt_page_is_65_naming_file_row_group_and_column(vectors_index, tmp_path, kind, make, column, skip):
    live_version = OutputDir(vectors_index.out).current_version()
    bad = shard(tmp_path / "bad.parquet", "bad", **make)
    damage(bad, column, skip)
    rc, stderr, report = vectors_index(bad)
    assert rc == 65, stderr
    line = stderr.strip().splitlines()[-1]
    assert str(bad) in line and "corrupt data" in line and f"(row group 2, column {column!r})" in line, line
    assert report["status"] == "failed" and report["exit_code"] == 65 and str(bad) in report["message"]
    assert report["retries"]["read"] == 0  # corruption is never retried as an I/O error
    assert OutputDir(vectors_index.out).current_version() == live_version  # nothing published


def test_a_transient_read_error_is_retried_and_counted(vectors_index, tmp_path, monkeypatch):
    new = shard(tmp_path / "new.parquet", "new")
    rc, _, _ = run(tmp_path / "good.parquet", new, "--out", tmp_path / "clean", "--vectors-column", "emb",
                   monkeypatch=monkeypatch, report=tmp_path / "clean.json")
    assert rc == 0
    # one failure in each read: the footer (preflight), the dimension's first rows, the shard's rows
    rc, stderr, report = vectors_index(new, fault="read_footer:1:eio,read_batch:1:eio,read_batch:3:eio")
    assert rc == 0 and report["retries"]["read"] == 3, stderr
    assert "recovered: 3 read" in stderr.splitlines()[-1]
    ids, vectors = live(vectors_index.out)
    clean_ids, clean_vectors = live(tmp_path / "clean")
    assert ids == clean_ids and len(ids) == 2 * ROWS
    np.testing.assert_array_equal(vectors, clean_vectors)


@pytest.mark.parametrize("point", ["read_footer", "read_batch"])
def test_a_read_error_that_persists_is_74_naming_the_file(vectors_index, tmp_path, point):
    live_version = OutputDir(vectors_index.out).current_version()
    new = shard(tmp_path / "new.parquet", "new", fixed=point == "read_batch")  # fixed: only the rows phase reads
    rc, stderr, report = vectors_index(new, fault=f"{point}:1+:eio")
    assert rc == 74, stderr
    line = stderr.strip().splitlines()[-1]
    assert str(new) in line and "read error after 3 retries" in line and "not corrupt" in line, line
    assert report["status"] == "failed" and report["exit_code"] == 74 and report["retries"]["read"] == 0
    assert "recovered" not in stderr  # the retries all failed (was: 'recovered: 3 read')
    assert OutputDir(vectors_index.out).current_version() == live_version


def test_text_run_corrupt_page_is_65_naming_file_row_group_and_column(tmp_path, monkeypatch):
    bad = shard(tmp_path / "bad.parquet", "bad")
    damage(bad, "text", 0)
    model = make_fake_model_dir(tmp_path / "model")
    rc, stderr, report = run(bad, "--out", tmp_path / "out", "--model", model, monkeypatch=monkeypatch,
                             report=tmp_path / "report.json", obj=fake_hooks(str(tmp_path / "fake.jsonl")))
    line = stderr.strip().splitlines()[-1]
    assert rc == 65 and str(bad) in line and "(row group 2, column 'text')" in line, stderr
    assert report["exit_code"] == 65 and report["retries"]["read"] == 0
    assert OutputDir(tmp_path / "out").current_version() is None
