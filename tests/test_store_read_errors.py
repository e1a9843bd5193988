"""Source reads outside the rows phase: the stored columns (the text of a ``--vectors-column`` run, the
``--keep-columns`` of any run) and the content hash that fingerprints a shard. They read the source as the rows
phase does: a corrupt page is 65 naming the source file, row group and column (never "cannot write" the output),
an OS read error is retried (counted in ``retries.read``) and 74 naming the source when it persists, permission
denied is 66; a write error on the output stays 74 naming the output. The report is written, nothing is
published. Shards are real Parquet files (dictionary pages, snappy) with bytes overwritten in one column chunk."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir
from petal.pipeline.store import embeddings
from tests.fake_cli import fake_hooks
from tests.fake_engine import make_fake_model_dir
from tests.test_vectors_read_errors import run as run_index

DIM, ROWS, GROUP = 8, 400, 100  # 4 row groups: the damage is in row group 2


def shard(path: Path, prefix: str) -> Path:
    vectors = np.random.default_rng(sum(prefix.encode())).standard_normal((ROWS, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    table = pa.table({"id": [f"{prefix}-{i}" for i in range(ROWS)],
                      "emb": pa.array(vectors.tolist(), pa.list_(pa.float32())),
                      "text": [f"{prefix} document {i} about glaciers" for i in range(ROWS)],
                      "lang": [f"lang-{i % 7}" for i in range(ROWS)]})
    pq.write_table(table, path, row_group_size=GROUP)  # pyarrow's defaults: dictionary pages, snappy
    return path


def damaged(path: Path, prefix: str, column: str, error: str) -> Path:
    """``shard`` with 8 bytes overwritten in row group 2's chunk of ``column``, at the first offset where reading
    that column fails with ``error`` (pyarrow's message); the footer and the other columns still read."""
    meta = pq.ParquetFile(shard(path, prefix)).metadata
    chunk = meta.row_group(2).column(meta.schema.to_arrow_schema().names.index(column))
    clean = path.read_bytes()
    for at in range(chunk.data_page_offset, chunk.data_page_offset + chunk.total_compressed_size - 8):
        data = bytearray(clean)
        data[at:at + 8] = b"\x7f\xff\x00\xff\x13\x80\xff\xee"
        path.write_bytes(bytes(data))
        try:
            for _ in pq.ParquetFile(path).iter_batches(columns=[column]):
                pass
        except (OSError, pa.ArrowException) as exc:
            if error in str(exc):
                for other in ("id", "emb", "text", "lang"):
                    if other != column:
                        pq.read_table(path, columns=[other])
                return path
    raise AssertionError(f"no offset in {column!r} gives {error!r}")


def run(*args: str | Path, report: Path, monkeypatch: pytest.MonkeyPatch, fault: str | None = None,
        obj: object = None) -> tuple[int, str, dict]:
    """``tests/test_vectors_read_errors.py``'s ``run``, with stderr's last line."""
    code, stderr, report_json = run_index(*args, report=report, monkeypatch=monkeypatch, fault=fault, obj=obj)
    return code, stderr.strip().splitlines()[-1], report_json


@pytest.fixture
def petal(tmp_path, monkeypatch):
    """``petal(*sources, text=False, fault=...)``: ``petal index SOURCES --out tmp/out`` with ``--vectors-column
    emb`` (``text``: a text run with the fake engine and ``--keep-columns lang``); tmp/good.parquet is live."""
    out, report, model = tmp_path / "out", tmp_path / "report.json", make_fake_model_dir(tmp_path / "model")

    def index(*sources: Path, text: bool = False, fault: str | None = None) -> tuple[int, str, dict]:
        how = ["--model", model, "--keep-columns", "lang"] if text else ["--vectors-column", "emb"]
        return run(*sources, "--out", out, *how, report=report, monkeypatch=monkeypatch, fault=fault,
                   obj=fake_hooks(str(tmp_path / "fake.jsonl")) if text else None)

    index.out = out  # type: ignore[attr-defined]
    index.good = shard(tmp_path / "good.parquet", "good")  # type: ignore[attr-defined]
    return index


def published(petal, rc: int, line: str, report: dict) -> str | None:
    """The live version after a failed run, checking what every failure here shares."""
    assert report["status"] == "failed" and report["exit_code"] == rc and report["message"] in line
    assert not list((petal.out / "store").rglob("*.tmp-*")), "a temporary columns file was left behind"
    return OutputDir(petal.out).current_version()


# (what is damaged, which run reads it only when storing the columns, pyarrow's error)
CORRUPT = [
    ("text", False, "Index not in dictionary bounds"),  # before: exit 1, an ArrowInvalid traceback
    ("text", False, "Corrupt snappy compressed data"),  # before: 74 "cannot write OUT/store/columns/..."
    ("text", False, "Couldn't deserialize thrift"),  # before: 74 "cannot write OUT/store/columns/..."
    ("lang", True, "Index not in dictionary bounds"),  # --keep-columns of a text run
    ("lang", True, "Corrupt snappy compressed data"),
]


@pytest.mark.parametrize("column, text, error", CORRUPT, ids=[f"{c[0]}-{c[2].split()[0]}" for c in CORRUPT])
def test_a_corrupt_page_of_a_stored_column_is_65_naming_the_source(petal, tmp_path, column, text, error):
    rc, _, _ = petal(petal.good, text=text)
    assert rc == 0
    live_version = OutputDir(petal.out).current_version()
    bad = damaged(tmp_path / "bad.parquet", "bad", column, error)
    rc, line, report = petal(petal.good, bad, text=text)
    assert rc == 65, line
    assert str(bad) in line and f"(row group 2, column {column!r})" in line and "corrupt data" in line, line
    assert "cannot write" not in line and "store/columns" not in line, line
    assert report["retries"]["read"] == 0  # corruption is never retried as an I/O error
    assert published(petal, 65, line, report) == live_version


def test_a_transient_read_error_of_the_stored_columns_is_retried(petal, tmp_path):
    new = shard(tmp_path / "new.parquet", "new")
    # read_batch: the dimension's first rows (1), the shard's vectors (2), its text for the stored columns (3)
    rc, line, report = petal(new, fault="read_batch:3:eio")
    assert rc == 0 and report["retries"]["read"] == 1, line
    [stored] = (petal.out / "store" / "columns").rglob("*.parquet")  # the text, as the shard holds it
    assert pq.read_table(stored).column("text").to_pylist() == [f"new document {i} about glaciers" for i in range(ROWS)]


def test_a_read_error_of_the_stored_columns_that_persists_is_74_naming_the_source(petal, tmp_path):
    new = shard(tmp_path / "new.parquet", "new")
    rc, line, report = petal(new, fault="read_batch:3+:eio")
    assert rc == 74, line
    assert str(new) in line and "read error after 3 retries" in line and "not corrupt" in line, line
    assert "cannot write" not in line and report["retries"]["read"] == 0 and "recovered" not in line
    assert published(petal, 74, line, report) is None


def test_a_write_error_of_the_stored_columns_is_74_naming_the_output(petal, monkeypatch):
    class FullDisk(pq.ParquetWriter):
        def write_table(self, table: pa.Table, row_group_size: int | None = None) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "ParquetWriter", FullDisk)  # NOTE: pq.write_table (the store's entries) is not this
    rc, line, report = petal(petal.good)
    assert rc == 74 and "cannot write" in line and str(petal.out / "store" / "columns") in line, line
    assert "No space left on device" in line and str(petal.good) not in line, line
    assert published(petal, 74, line, report) is None


# --- the content hash (fingerprint) ------------------------------------------------------------------------

@pytest.mark.parametrize("text", [True, False], ids=["text", "vectors"])
def test_a_transient_read_error_of_the_content_hash_is_retried_and_counted(petal, text):
    rc, line, report = petal(petal.good, text=text, fault="read_content:1:eio")
    assert rc == 0 and report["retries"]["read"] == 1, line
    assert "recovered: 1 read" in line


@pytest.mark.parametrize("text", [True, False], ids=["text", "vectors"])
def test_a_read_error_of_the_content_hash_that_persists_is_74_after_retries(petal, text):
    rc, line, report = petal(petal.good, text=text, fault="read_content:1+:eio")
    assert rc == 74 and str(petal.good) in line and "read error after 3 retries" in line, line
    assert report["retries"]["read"] == 0 and "recovered" not in line  # none of the 3 retries succeeded
    assert published(petal, 74, line, report) is None


def test_permission_denied_while_hashing_is_66_at_once(petal, monkeypatch):
    def denied(path: Path | str) -> str:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(embeddings, "sha256_file", denied)  # root reads a mode-000 file: the error is injected
    rc, line, report = petal(petal.good, text=True)
    assert rc == 66 and str(petal.good) in line and "cannot be read (Permission denied)" in line, line
    assert report["retries"]["read"] == 0
    assert published(petal, 66, line, report) is None
