"""The text column a ``--vectors-column`` run stores beside the vectors (when every shard has one), as the shard
holds it: binary (plain, large, fixed-size, dictionary-encoded) whose bytes are not UTF-8 is stored as a string
column's, read back with U+FFFD (it failed the run after the vectors were stored: 65 'cannot read rows from row 0:
corrupt data (Invalid UTF8 payload)', a sound file called corrupt); a list or struct, which cannot be text, is 65
naming the shard, column and type before any work (it was the same 'corrupt data' message, 'Unsupported cast').

Real ``petal`` processes, real Parquet and FAISS (no model).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO

RAW = [b"\xff\xfe", b"ok", b"xy", None]


def petal(*argv: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def shard(path: Path, text: pa.Array) -> Path:
    emb = pa.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0], [0, 0, 0, 1.0]], pa.list_(pa.float32()))
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "emb": emb, "text": text}), path)
    return path


def test_text_bytes_not_utf8_are_stored_as_a_string_columns(tmp_path):
    texts = {"binary": pa.array(RAW, pa.binary()), "large": pa.array(RAW, pa.large_binary()),
             "fixed": pa.array(RAW, pa.binary(2)), "dictionary": pa.array(RAW, pa.binary()).dictionary_encode()}
    np.save(tmp_path / "q.npy", np.ones((1, 4), np.float32))
    for kind, text in texts.items():
        out = tmp_path / kind
        done = petal("index", shard(tmp_path / f"{kind}.parquet", text), "--out", out, "-q", "--vectors-column", "emb")
        assert done.returncode == 0, (kind, done.stderr[-3000:])
        found = petal("query", out, "--vector-file", tmp_path / "q.npy", "--show-text", "-k", "4", "--json")
        assert found.returncode == 0, (kind, found.stderr[-3000:])
        hits = {hit["id"]: hit["text"] for hit in json.loads(found.stdout)["hits"]}
        assert hits == {"a": "\ufffd\ufffd", "b": "ok", "c": "xy", "d": None}, kind


@pytest.mark.parametrize("text", [pa.array([[1], [2], None, []]), pa.array([{"a": 1}] * 4)], ids=["list", "struct"])
def test_a_text_column_that_cannot_be_text_is_65_naming_it(tmp_path, text):
    path = shard(tmp_path / "s.parquet", text)
    refused = petal("index", path, "--out", tmp_path / "out", "-q", "--vectors-column", "emb")
    assert refused.returncode == 65, refused.stderr[-3000:]
    last = refused.stderr.splitlines()[-1]
    assert f"{path}: text column 'text' has type {str(text.type).split('<')[0]}<" in last
    assert "which cannot be stored as text beside the vectors" in last
    assert not (tmp_path / "out" / "CURRENT").exists()
