"""An ``ids.parquet`` without a stored column its signed manifest records (``columns.keep``) is 65 naming the file
and the column, from ``petal query``, ``petal.open_index`` and ``petal verify`` alike: a ``--where`` on that column
was a pyarrow ``KeyError`` traceback (exit 1), and verify said ok.

Real Parquet, real FAISS; each command in its own process (tests/forkrun.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests import forkrun
from tests._open_audit_shared import api, copy_index, record_files, signed_manifest, vectors_index

ROWS, DIM = 400, 16


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vectors_index(tmp_path_factory.mktemp("stored_columns"), "--index-factory", "Flat",
                         "--keep-columns", "lang,topic", rows=ROWS, dim=DIM, seed=3,
                         lang=[("en", "de")[i % 2] for i in range(ROWS)],
                         topic=[("a", "b")[i % 2] for i in range(ROWS)])


def signed_again(version: Path, keep: list[str]) -> None:
    with signed_manifest(version) as manifest:
        manifest["columns"]["keep"] = keep
        record_files(version, manifest, sha256=True)


def without_topic(ids: Path) -> None:
    pq.write_table(pq.read_table(ids).drop_columns(["topic"]), ids, write_page_checksum=True)


@pytest.mark.parametrize("damage", ["a column the file never had", "the column dropped from the file"])
def test_a_kept_column_missing_from_ids_parquet_is_65_naming_it(built: Path, tmp_path: Path, damage: str) -> None:
    out, version = copy_index(built, tmp_path)
    if damage == "a column the file never had":
        signed_again(version, ["lang", "topic", "year"])
        column, where = "year", "year = 2020"
    else:
        without_topic(version / "ids.parquet")
        signed_again(version, ["lang", "topic"])
        column, where = "topic", "topic = 'a'"
    q = str(built.parent / "q.npy")
    for argv in (["query", str(out), "--vector-file", q, "--where", where], ["query", str(out), "--vector-file", q]):
        done = forkrun.petal(argv)
        assert done.rc == 65 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert "ids.parquet" in done.last_line and f'has no column {column}' in done.last_line, done.last_line
    opened = api(out, where)
    assert opened.returncode == 65 and f"has no column {column}" in opened.stderr, opened.stderr[-2000:]
    verify = forkrun.petal(["verify", str(out)])
    assert verify.rc == 65 and "MISMATCH  ids.parquet" in verify.stdout, verify.stdout + verify.stderr


def test_the_kept_columns_as_written_still_filter(built: Path) -> None:
    done = forkrun.petal(["query", str(built), "--vector-file", str(built.parent / "q.npy"), "--where", "topic = 'b'",
                          "-k", "3", "--json"])
    assert done.rc == 0, done.stderr
    assert {hit["fields"]["topic"] for hit in json.loads(done.stdout)["hits"]} == {"b"}
