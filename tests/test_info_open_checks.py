"""``petal info`` refuses what opening refuses without FAISS, with the same code and message: ``ids.parquet``'s footer
(as many ids as vectors, the columns a hit needs, the stored columns the manifest records) and a binary index's
``rescore.npy`` (listed, of ``[vectors, dim]`` floats) (``pipeline/index/open_checks.py``, one implementation).

Before: ``petal info`` ran only the checksum and header checks, so a version whose ``ids.parquet`` held fewer ids than
its vectors, or whose ``rescore.npy`` was of another shape (each signed again over the file), was shown exit 0 while
every ``petal query`` refused it with 65; and the query's "N ids for M vectors" named the version directory, not the
file. Real indexes (``--vectors-column``), real ``petal`` processes (tests/forkrun.py), manifests signed again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests import forkrun
from tests._open_audit_shared import copy_index, resign, signed_manifest, vectors_index

ROWS, DIM = 40, 16


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    flat = vectors_index(tmp_path_factory.mktemp("flat"), "--index-factory", "Flat", "--keep-columns", "lang",
                         rows=ROWS, dim=DIM, seed=1, lang=["en", "fr"] * (ROWS // 2))
    binary = vectors_index(tmp_path_factory.mktemp("binary"), "--index-factory", "BFlat", rows=ROWS, dim=DIM, seed=2)
    return {"flat": flat, "binary": binary}


def fewer_ids(version: Path) -> None:
    ids = pq.read_table(version / "ids.parquet")
    pq.write_table(ids.slice(0, ROWS - 1), version / "ids.parquet")
    resign(version, sha256=True)


def without(column: str) -> Callable[[Path], None]:
    def drop(version: Path) -> None:
        ids = pq.read_table(version / "ids.parquet")
        pq.write_table(ids.drop_columns([column]), version / "ids.parquet")
        resign(version, sha256=True)

    return drop


def rescore_of_another_shape(version: Path) -> None:
    np.save(version / "rescore.npy", np.zeros((ROWS - 1, DIM), np.float16))
    resign(version, sha256=True)


def rescore_unlisted(version: Path) -> None:
    with signed_manifest(version) as manifest:
        del manifest["index"]["files"]["rescore.npy"]
        del manifest["integrity"]["files"]["rescore.npy"]


# index, damage, exit code, words of the refusal (after the damaged file's path, where it is a file's)
CASES = {
    "fewer-ids": ("flat", fewer_ids, 65, "ids.parquet", f": {ROWS - 1} ids for the {ROWS} vectors of index.faiss"),
    "no-id-column": ("flat", without("id"), 65, "ids.parquet", " has no column id;"),
    "no-kept-column": ("flat", without("lang"), 65, "ids.parquet", " has no column lang"),
    "rescore-shape": ("binary", rescore_of_another_shape, 65, "rescore.npy",
                      f": holds float16 ({ROWS - 1}, {DIM}), the index has {ROWS} float vectors of dim {DIM}"),
    "rescore-unlisted": ("binary", rescore_unlisted, 78, "", ": rescore.npy is missing or not listed in the manifest"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_info_refuses_what_opening_refuses_with_its_code_and_message(built, tmp_path, case):
    name, damage, code, file, words = CASES[case]
    out, version = copy_index(built[name], tmp_path)
    damage(version)
    expected = f"{version / file}{words}" if file else f"{version}{words}"
    query = forkrun.petal(["query", str(out), "--vector-file", str(built[name].parent / "q.npy")])
    assert query.rc == code, query.stderr[-2000:]
    assert expected in query.stderr.strip().splitlines()[-1], query.stderr[-2000:]
    info = forkrun.petal(["info", str(out)])
    assert info.rc == code, (info.stdout[-2000:], info.stderr[-2000:])
    assert "Traceback" not in info.stderr
    assert expected in info.stderr.strip().splitlines()[-1], info.stderr[-2000:]
    assert info.stdout.startswith("version "), info.stdout  # what the manifest says is printed first
    as_json = forkrun.petal(["info", str(out), "--json"])
    assert as_json.rc == code, as_json.stderr[-2000:]
    said = json.loads(as_json.stdout)
    assert said["ok"] is False and said["exit_code"] == code and expected in said["error"], said


@pytest.mark.parametrize("name", ["flat", "binary"])
def test_a_version_as_petal_wrote_it_still_passes_info(built, name):
    info = forkrun.petal(["info", str(built[name])])
    assert info.rc == 0 and not info.stderr, info.stderr[-2000:]
