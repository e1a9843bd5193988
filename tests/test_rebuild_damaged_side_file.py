"""``petal rebuild OUT`` over a store whose stored-columns side file (the text and ``--keep-columns`` of an entry,
``OUT/store/columns/...``) has no footer to read (cut, emptied, garbage, a footer length that points nowhere): the
side file counts as gone, so the version's columns are copied from the previous version, which holds the same rows,
and that is said; with the previous version's ``ids.parquet`` gone too it is 65 naming the side file. Before: a
pyarrow traceback, exit 1 (``ArrowInvalid: Parquet magic bytes not found``, or ``OSError: Couldn't deserialize
thrift``), where a side file removed by hand was already copied from the previous version.

Real ``petal`` processes, real Parquet and FAISS, a ``--vectors-column`` index storing text and a kept column.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir
from tests.conftest import REPO

DIM = 8


def petal(*argv: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rebuild-side-file")
    for n, name in enumerate("ab"):
        flat = np.random.default_rng(n).standard_normal((40, DIM)).astype(np.float32).ravel()
        pq.write_table(pa.table({"id": np.arange(40) + 100 * n, "text": [f"text {name}{i}" for i in range(40)],
                                 "lang": ["en", "de"] * 20,
                                 "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                       root / f"{name}.parquet")
    proc = petal("index", root / "a.parquet", root / "b.parquet", "--out", root / "out", "-q", "--vectors-column",
                 "emb", "--keep-columns", "lang")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root / "out"


def _cut(data: bytes) -> bytes:
    return data[:100]


def _footer_length(data: bytes) -> bytes:
    # NOTE: the 4-byte footer length before the closing magic, made to point past the start: an OSError from pyarrow
    return data[:-8] + bytes([data[-8] ^ 0x40]) + data[-7:]


DAMAGE = {"cut": _cut, "emptied": lambda data: b"", "garbage": lambda data: b"x" * len(data),
          "footer length": _footer_length, "tail cut": lambda data: data[:-10]}


def _stored(out: Path) -> list[tuple]:
    version = out / "versions" / str(OutputDir(out).current_version())
    table = pq.read_table(version / "ids.parquet", columns=["id", "text", "lang"])
    return sorted(zip(*(table.column(n).to_pylist() for n in ("id", "text", "lang"))))


def _side_file(out: Path) -> Path:
    return sorted((out / "store" / "columns").glob("*/*.parquet"))[0]


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_side_file_without_a_footer_is_copied_from_the_previous_version(built, tmp_path, damage):
    out = tmp_path / "out"
    shutil.copytree(built, out)
    before, live = _stored(out), OutputDir(out).current_version()
    side = _side_file(out)
    side.write_bytes(DAMAGE[damage](side.read_bytes()))
    proc = petal("rebuild", out, "--index-factory", "HNSW8")
    assert proc.returncode == 0, proc.stderr[-3000:]  # was: 1, a pyarrow traceback
    assert "Traceback" not in proc.stderr
    assert f"copied from version {live}" in proc.stderr and side.name in proc.stderr
    assert OutputDir(out).current_version() != live
    assert _stored(out) == before
    assert petal("verify", out).returncode == 0


@pytest.mark.parametrize("damage", ["cut", "footer length"])
def test_with_the_previous_ids_gone_too_it_is_65_naming_the_side_file(built, tmp_path, damage):
    out = tmp_path / "out"
    shutil.copytree(built, out)
    live = OutputDir(out).current_version()
    side = _side_file(out)
    side.write_bytes(DAMAGE[damage](side.read_bytes()))
    os.unlink(out / "versions" / str(live) / "ids.parquet")
    proc = petal("rebuild", out)
    assert proc.returncode == 65, proc.stderr[-3000:]  # was: 1, a pyarrow traceback
    assert "Traceback" not in proc.stderr
    assert side.name in proc.stderr.splitlines()[-1]
    assert OutputDir(out).current_version() == live
    assert not list((out / "versions").glob(".staging*"))
