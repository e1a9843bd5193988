"""``petal verify`` decodes ``ids.parquet`` as searches read it: a manifest signed again over an ``ids.parquet``
whose pages do not decode (or that lacks a column a hit needs) is 65 naming the file. Its sha256 matched, so verify
said ok while every ``petal query`` was 65 ('... the version is corrupt: run petal verify and rebuild it').

Real Parquet, real FAISS; each command in its own process (tests/forkrun.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.checksums import INTEGRITY_KEY
from tests import forkrun
from tests._open_audit_shared import copy_index, resign, signed_manifest, vectors_index

ROWS, DIM = 500, 16


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vectors_index(tmp_path_factory.mktemp("verify_ids"), "--index-factory", "Flat", "--keep-columns", "lang",
                         rows=ROWS, dim=DIM, seed=2, lang=[("en", "de")[i % 2] for i in range(ROWS)])


def flip(path: Path, at: float) -> None:
    blob = bytearray(path.read_bytes())
    blob[int(len(blob) * at) if at < 1 else int(at)] ^= 0xFF
    path.write_bytes(bytes(blob))


def no_row_column(path: Path) -> None:
    pq.write_table(pq.read_table(path).drop_columns(["row"]), path, write_page_checksum=True)


def last_byte_of(path: Path, column: str) -> int:
    """The offset of the last byte of ``column``'s chunk: inside its last page's body, which the page's CRC covers.
    NOTE: not a fraction of the file: the file's layout moves with the shard path it stores (the test's temporary
    directory), and a byte in a page header's statistics changes nothing decoded."""
    meta = pq.ParquetFile(path).metadata.row_group(0)
    [chunk] = [meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema == column]
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    return int(start + chunk.total_compressed_size - 1)


DAMAGE = {
    "page header": lambda p: flip(p, 10),  # faiss_id's first page header: no search reads that column
    "page body": lambda p: flip(p, last_byte_of(p, "id")),
    "no row column": no_row_column,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_verify_finds_an_ids_file_that_searches_cannot_read(built: Path, tmp_path: Path, damage: str) -> None:
    out, version = copy_index(built, tmp_path)
    DAMAGE[damage](version / "ids.parquet")
    resign(version, sha256=True)
    done = forkrun.petal(["verify", str(out)])
    assert done.rc == 65 and "MISMATCH  ids.parquet" in done.stdout, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "ids.parquet" in done.last_line, done.stderr
    as_json = forkrun.petal(["verify", str(out), "--json"])
    verdict = json.loads(as_json.stdout)
    assert as_json.rc == 65 and verdict["ok"] is False and verdict["exit_code"] == 65, as_json.stdout
    assert [f["name"] for f in verdict["files"] if not f["ok"]] == ["ids.parquet"], verdict
    if damage == "page body":  # what the queries of this version said, and still say
        query = forkrun.petal(["query", str(out), "--vector-file", str(built.parent / "q.npy"), "-k", "500"])
        assert query.rc == 65 and "ids.parquet" in query.last_line, query.stderr


def test_an_intact_version_still_verifies(built: Path) -> None:
    done = forkrun.petal(["verify", str(built)])
    assert done.rc == 0 and "MISMATCH" not in done.stdout, done.stdout + done.stderr


def _span_one(manifest: dict) -> None:
    manifest[INTEGRITY_KEY]["head_tail_bytes"] = 1


def _other_head_tail(manifest: dict) -> None:
    manifest[INTEGRITY_KEY]["files"]["index.faiss"]["head_tail_sha256"] = "0" * 64


RECORDS = {"head_tail_bytes 1": _span_one, "another head/tail sha256": _other_head_tail}


@pytest.mark.parametrize("edit", list(RECORDS))
def test_verify_checks_the_head_tail_records_opening_checks(built: Path, tmp_path: Path, edit: str) -> None:
    """A manifest signed again whose head/tail records do not match files whose sha256 does: every open is 65
    ('head/tail checksum does not match'), and petal verify said ok (it compared sizes and sha256 only)."""
    out, version = copy_index(built, tmp_path)
    with signed_manifest(version) as manifest:
        RECORDS[edit](manifest)
    query = forkrun.petal(["query", str(out), "--vector-file", str(built.parent / "q.npy"), "-k", "1"])
    assert query.rc == 65 and "head/tail checksum does not match" in query.last_line, query.stderr
    done = forkrun.petal(["verify", str(out)])
    assert done.rc == 65 and "MISMATCH  index.faiss" in done.stdout, done.stdout + done.stderr
    assert "head/tail checksum does not match the manifest's record" in done.last_line, done.stderr
