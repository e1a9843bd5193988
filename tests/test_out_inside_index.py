"""``--out`` inside another index's ``versions/`` or ``store/`` is refused (73) before anything is read or written.
Before, ``petal index ... --out IDX/versions`` wrote ``CURRENT``, ``store/`` and ``versions/`` in there, mixed into
IDX's own files. Real ``petal index`` processes (text runs fail before their model loads), real Parquet."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

PETAL = str(Path(sys.executable).parent / "petal")
MODES = {"text": [], "vectors": ["--vectors-column", "emb"], "workers": ["--workers", "2"]}


def index(*args: str | Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([PETAL, "index", *map(str, args), "-q"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert "Traceback" not in done.stderr, done.stderr
    return done


@pytest.fixture(scope="module")
def idx(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("out-inside")
    data = root / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["glaciers", "rivers"],
                             "emb": pa.array([[1.0, 0.0], [0.0, 1.0]], pa.list_(pa.float32()))}), data / "a.parquet")
    assert index(data, "--out", root / "idx", "--vectors-column", "emb").returncode == 0
    return data, root / "idx"


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("inside", ["versions", "versions/new", "store", "store/shards/x", "versions/../store/y"])
def test_out_inside_an_index_is_73_and_nothing_is_written(idx, mode, inside):
    data, out = idx
    before = tree(out)
    done = index(data, "--out", out / inside, *MODES[mode])
    last = done.stderr.strip().splitlines()[-1]
    part = "store" if "store" in inside else "versions"
    assert done.returncode == 73, (mode, inside, done.stderr)
    assert f"lies inside the {part}/ of the petal output directory {out}" in last, last
    assert tree(out) == before  # nothing created in there


def test_a_link_into_an_index_is_judged_by_where_it_leads(idx, tmp_path):
    data, out = idx
    (tmp_path / "link").symlink_to(out / "versions")
    done = index(data, "--out", tmp_path / "link" / "new", "--vectors-column", "emb")
    assert done.returncode == 73 and "lies inside the versions/" in done.stderr, done.stderr
