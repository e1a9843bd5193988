"""``--delete FILE`` is read as a source is: a 0-byte file is 65 saying it is empty and how to delete nothing, an OS
read error (EIO) is retried (counted in the report's ``retries.read``) and 74 naming the flag and the file when it
persists, never 65 "not a readable Parquet file"; nothing is deleted or published by a refused run. Before: a 0-byte
file was "not a readable Parquet file (Parquet file size is 0 bytes)" and an EIO was 65 at once. Real ``petal index``
processes (text runs with the packaged model, ``--vectors-column`` runs), real Parquet; the EIO comes from the
``read_footer`` fault point (hit 1 is the shard's preflight, hit 2 the ``--delete`` file)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

PETAL = str(Path(sys.executable).parent / "petal")
MODES = {"text": [], "vectors": ["--vectors-column", "emb"]}


def petal_index(tmp_path: Path, *args: str | Path, fault: str | None = None) -> tuple[subprocess.CompletedProcess,
                                                                                        dict]:
    env = {k: v for k, v in os.environ.items() if k != "PETAL_FAULT"}
    env["HF_HUB_OFFLINE"] = "1"
    if fault:
        env["PETAL_FAULT"] = fault
    report = tmp_path / "report.json"
    done = subprocess.run([PETAL, "index", *map(str, args), "-q", "--json-report", str(report)], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    return done, json.loads(report.read_text())


def live_ids(out: Path) -> list:
    version = (out / "CURRENT").read_text().strip()
    return pq.read_table(out / "versions" / version / "ids.parquet", columns=["id"]).column("id").to_pylist()


@pytest.fixture(scope="module", params=list(MODES))
def built(request, tmp_path_factory) -> tuple[Path, Path, str]:
    """``(docs.parquet, OUT, mode)``: one real run per mode, copied by every test (the store names docs.parquet where
    it is, so it stays there)."""
    root = tmp_path_factory.mktemp(f"built-{request.param}")
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["glaciers", "rivers", "tides"],
                             "emb": pa.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], pa.list_(pa.float32()))}),
                   root / "docs.parquet")
    done, _ = petal_index(root, root / "docs.parquet", "--out", root / "out", *MODES[request.param])
    assert done.returncode == 0, done.stderr
    return root / "docs.parquet", root / "out", request.param


@pytest.fixture
def indexed(built, tmp_path: Path):
    docs, out, mode = built
    shutil.copytree(out, tmp_path / "out", symlinks=True)
    pq.write_table(pa.table({"id": ["b"]}), tmp_path / "del.parquet")
    return [docs, "--out", tmp_path / "out", *MODES[mode]]


def test_a_zero_byte_delete_file_says_it_is_empty(indexed, tmp_path):
    (tmp_path / "empty.parquet").write_bytes(b"")
    done, report = petal_index(tmp_path, *indexed, "--delete", tmp_path / "empty.parquet")
    said = (f"--delete {tmp_path / 'empty.parquet'} is empty (0 bytes): not a Parquet file; to delete nothing, give "
            "a Parquet file with no rows or leave the flag out")
    assert done.returncode == 65 and done.stderr.splitlines()[-1] == f"petal: error: {said}", done.stderr
    assert report["exit_code"] == 65 and report["message"] == said
    assert live_ids(tmp_path / "out") == ["a", "b", "c"]
    # what the message offers works: a Parquet file with no rows deletes nothing
    pq.write_table(pa.table({"id": pa.array([], pa.string())}), tmp_path / "none.parquet")
    done, report = petal_index(tmp_path, *indexed, "--delete", tmp_path / "none.parquet")
    assert done.returncode == 0 and live_ids(tmp_path / "out") == ["a", "b", "c"], done.stderr


def test_a_read_error_on_the_delete_file_is_retried(indexed, tmp_path):
    done, report = petal_index(tmp_path, *indexed, "--delete", tmp_path / "del.parquet", fault="read_footer:2:eio")
    assert done.returncode == 0, done.stderr
    assert report["retries"]["read"] == 1 and live_ids(tmp_path / "out") == ["a", "c"]


def test_a_read_error_on_the_delete_file_that_persists_is_74(indexed, tmp_path):
    done, report = petal_index(tmp_path, *indexed, "--delete", tmp_path / "del.parquet", fault="read_footer:2+:eio")
    assert done.returncode == 74, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"petal: error: --delete {tmp_path / 'del.parquet'}: read error after 3 retries"), last
    assert "not corrupt" in last and report["exit_code"] == 74 and report["retries"]["read"] == 0
    assert "recovered" not in done.stderr
    assert live_ids(tmp_path / "out") == ["a", "b", "c"]


@pytest.mark.parametrize("kind", ["string", "large_string", "dictionary"])
def test_delete_ids_that_are_not_utf8_are_65_naming_the_row(indexed, tmp_path, kind):
    """pyarrow reads a string column's bytes unchecked: a --delete id that is not UTF-8 was a UnicodeDecodeError
    traceback (exit 1). Now 65 naming the file, column and row; nothing is deleted."""
    text = pa.large_string() if kind == "large_string" else pa.string()
    offsets = np.array([0, 1, 3], dtype=np.int64 if kind == "large_string" else np.int32)
    bad = pa.Array.from_buffers(text, 2, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"b\xff\xfe")])
    if kind == "dictionary":
        bad = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), bad)
    pq.write_table(pa.table({"id": bad}), tmp_path / "bad.parquet")
    done, report = petal_index(tmp_path, *indexed, "--delete", tmp_path / "bad.parquet")
    assert done.returncode == 65, done.stderr
    assert "column 'id' row 1 holds bytes that are not UTF-8" in done.stderr.splitlines()[-1]
    assert report["exit_code"] == 65 and live_ids(tmp_path / "out") == ["a", "b", "c"]
