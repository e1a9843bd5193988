"""An ``ids.parquet`` without a stored column its signed manifest records (``columns.keep``) is 65 naming the file
and the column, from ``petal query``, ``petal.open_index`` and ``petal verify`` alike: a ``--where`` on that column
was a pyarrow ``KeyError`` traceback (exit 1), and verify said ok.

Real Parquet, real FAISS; each command in its own process (tests/forkrun.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.checksums import CHECKSUM_KEY, INTEGRITY_KEY, canonical_sha256, head_tail_sha256
from tests import forkrun
from tests._open_audit_shared import api

ROWS, DIM = 400, 16


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stored_columns")
    flat = np.random.default_rng(3).standard_normal((ROWS, DIM)).astype(np.float32)
    data = root / "v.parquet"
    pq.write_table(pa.table({"id": np.arange(ROWS), "lang": [("en", "de")[i % 2] for i in range(ROWS)],
                             "topic": [("a", "b")[i % 2] for i in range(ROWS)],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), DIM)}), data)
    np.save(root / "q.npy", flat[:1])
    out = root / "out"
    done = forkrun.petal(["index", str(data), "--out", str(out), "-q", "--vectors-column", "emb",
                          "--index-factory", "Flat", "--keep-columns", "lang,topic"], timeout=300)
    assert done.rc == 0, done.stderr[-2000:]
    return out


def signed_again(version: Path, keep: list[str]) -> None:
    path = version / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["columns"]["keep"] = keep
    for name, record in manifest[INTEGRITY_KEY]["files"].items():
        size = (version / name).stat().st_size
        sha = hashlib.sha256((version / name).read_bytes()).hexdigest()
        record.update(size=size, head_tail_sha256=head_tail_sha256(version / name, size), sha256=sha)
        if name in manifest["index"]["files"]:
            manifest["index"]["files"][name] = sha
    manifest.pop(CHECKSUM_KEY)
    manifest[CHECKSUM_KEY] = canonical_sha256(manifest)
    path.write_text(json.dumps(manifest, indent=2))


def without_topic(ids: Path) -> None:
    pq.write_table(pq.read_table(ids).drop_columns(["topic"]), ids, write_page_checksum=True)


@pytest.mark.parametrize("damage", ["a column the file never had", "the column dropped from the file"])
def test_a_kept_column_missing_from_ids_parquet_is_65_naming_it(built: Path, tmp_path: Path, damage: str) -> None:
    out = tmp_path / "out"
    shutil.copytree(built, out)
    version = out / "versions" / (out / "CURRENT").read_text().strip()
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
