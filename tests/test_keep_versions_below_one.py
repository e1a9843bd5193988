"""``--keep-versions`` below 1 is one usage error (2), worded one way, by ``petal index`` and ``petal rebuild`` (and by
``petal.index`` and ``petal.rebuild``, naming the keyword).

Before: ``petal index --keep-versions 0`` said "--keep-versions 0 < 1: the live version is always kept" while ``petal
rebuild --keep-versions 0`` said click's "Invalid value for '--keep-versions': 0 is not in the range x>=1." (and
``petal.rebuild(keep_versions=0)`` a bare "keep_versions 0 < 1").

Real ``petal`` processes (forked from a preloaded interpreter: tests/forkrun.py), real Parquet and FAISS, a
``--vectors-column`` index.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import petal
from tests import forkrun
from tests.index_data import vector_shard


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("keep-below-one")
    vector_shard(root, 0).rename(root / "a.parquet")
    run = forkrun.petal(["index", str(root / "a.parquet"), "--out", str(root / "out"), "-q", "--vectors-column",
                         "emb", "--index-factory", "Flat"], timeout=300)
    assert run.rc == 0, run.stderr[-3000:]
    return root


def versions(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "versions").iterdir() if not p.name.startswith("."))


def error_line(run: forkrun.Result) -> str:
    return next(line for line in reversed(run.stderr.splitlines()) if line.startswith("Error: "))


@pytest.mark.parametrize("value", ["0", "-1"])
def test_index_and_rebuild_refuse_it_alike(built: Path, value: str) -> None:
    out = built / "out"
    before = versions(out)
    index = forkrun.petal(["index", str(built / "a.parquet"), "--out", str(out), "--vectors-column", "emb",
                           "--keep-versions", value], timeout=300)
    rebuild = forkrun.petal(["rebuild", str(out), "--keep-versions", value], timeout=300)
    for run in (index, rebuild):
        assert run.rc == 2 and "Traceback" not in run.stderr, (run.rc, run.stderr[-2000:])
    assert error_line(index) == error_line(rebuild), (index.stderr, rebuild.stderr)
    said = error_line(rebuild)
    assert f"--keep-versions {value} < 1" in said and "the live version is always kept" in said, said
    assert "is not in the range" not in rebuild.stderr, rebuild.stderr
    assert versions(out) == before


def test_the_api_says_it_alike_naming_the_keyword(built: Path) -> None:
    out = built / "out"
    with pytest.raises(petal.UsageError) as index_error:
        petal.index(built / "a.parquet", out, vectors_column="emb", keep_versions=0, quiet=True)
    with pytest.raises(petal.UsageError) as rebuild_error:
        petal.rebuild(out, keep_versions=0, quiet=True)
    assert str(index_error.value) == str(rebuild_error.value), (index_error.value, rebuild_error.value)
    assert str(rebuild_error.value).startswith("keep_versions 0 < 1: the live version is always kept")
