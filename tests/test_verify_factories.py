"""``petal verify`` of an index whose empty factory FAISS cannot read back (an additive quantizer, ``RQ4x8``: its
untrained codebooks are empty) compares the index with its manifest's factory by shape: it was a RuntimeError
traceback (exit 1) from the structure check, on an index ``petal query`` answers from.

Real Parquet, real FAISS; each command in its own process (tests/forkrun.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import forkrun
from tests._open_audit_shared import copy_index, signed_manifest, vectors_index

ROWS, DIM = 300, 16  # NOTE: 300 vectors train RQ4x8's 256 centroids per step


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vectors_index(tmp_path_factory.mktemp("verify_rq"), "--index-factory", "RQ4x8", "--metric", "l2",
                         rows=ROWS, dim=DIM, seed=8)


def test_verify_of_an_additive_quantizer_index(built: Path) -> None:
    done = forkrun.petal(["verify", str(built)])
    assert done.rc == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr


def test_verify_still_finds_another_factory_in_the_manifest(built: Path, tmp_path: Path) -> None:
    out, version = copy_index(built, tmp_path)
    with signed_manifest(version) as manifest:
        manifest["index"]["factory"] = "RQ2x8"  # 2 bytes a code, where the file's index has 4
    done = forkrun.petal(["verify", str(out)])
    assert done.rc == 65 and "MISMATCH  index.faiss" in done.stdout, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "RQ2x8" in done.last_line, done.stderr
