"""A signed manifest's ``index.search_params`` that petal does not write (a count below 1 or past FAISS's C int, a
name the tuner never writes, one the index has not) is 78 naming the key, from ``petal query``, ``petal info``
(the typed manifest) and ``petal.open_index`` alike. They went to FAISS as they were: nprobe 0, -1 or 10**30 was
FAISS's 'cur_nprobe > 0' RuntimeError at the first search (a traceback, exit 1), and a name the index has not
(efSearch on an IVF index) '65 index.faiss: FAISS cannot read it ... the index is corrupt'.

Real Parquet, real FAISS; each command in its own process (tests/forkrun.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import forkrun
from tests._open_audit_shared import api, copy_index, signed_manifest, vectors_index

ROWS, DIM = 800, 16


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vectors_index(tmp_path_factory.mktemp("search_params"), "--index-factory", "IVF8,Flat", rows=ROWS, dim=DIM,
                         seed=4, queries=[0, 1])


CASES = {"nprobe 0": {"nprobe": 0}, "nprobe -1": {"nprobe": -1}, "nprobe 10**30": {"nprobe": 10**30},
         "unknown name": {"nprobe": 4, "bogus": 3}, "efSearch on IVF": {"nprobe": 4, "efSearch": 16}}


@pytest.mark.parametrize("case", list(CASES))
def test_search_params_petal_does_not_write_are_78_naming_the_key(built: Path, tmp_path: Path, case: str) -> None:
    out, version = copy_index(built, tmp_path)
    with signed_manifest(version) as manifest:  # signed again: only an edit that signs it makes one
        manifest["index"]["search_params"] = CASES[case]
    query = forkrun.petal(["query", str(out), "--vector-file", str(built.parent / "q.npy"), "-k", "3"])
    opened = api(out)
    for rc, stderr in ((query.rc, query.stderr), (opened.returncode, opened.stderr)):
        last = stderr.strip().splitlines()[-1]
        assert rc == 78 and "Traceback" not in stderr, stderr[-2000:]
        assert "manifest.json" in last and "index.search_params" in last, last
    if case != "efSearch on IVF":  # judged from the manifest alone: petal info too (no FAISS there)
        info = forkrun.petal(["info", str(out)])
        assert info.rc == 78 and "index.search_params" in info.last_line, info.stderr


def test_the_tuned_search_params_still_open(built: Path) -> None:
    query = forkrun.petal(["query", str(built), "--vector-file", str(built.parent / "q.npy"), "-k", "1", "--json"])
    assert query.rc == 0, query.stderr
    assert [json.loads(line)["hits"][0]["id"] for line in query.stdout.splitlines()] == [0, 1]
