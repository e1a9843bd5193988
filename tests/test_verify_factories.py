"""``petal verify`` of an index whose empty factory FAISS cannot read back (an additive quantizer, ``RQ4x8``: its
untrained codebooks are empty) compares the index with its manifest's factory by shape: it was a RuntimeError
traceback (exit 1) from the structure check, on an index ``petal query`` answers from.

Real Parquet, real FAISS; each command in its own process (tests/forkrun.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.checksums import CHECKSUM_KEY, canonical_sha256
from tests import forkrun

ROWS, DIM = 300, 16  # NOTE: 300 vectors train RQ4x8's 256 centroids per step


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verify_rq")
    flat = np.random.default_rng(8).standard_normal((ROWS, DIM)).astype(np.float32)
    data = root / "v.parquet"
    pq.write_table(pa.table({"id": np.arange(ROWS),
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), DIM)}), data)
    out = root / "out"
    done = forkrun.petal(["index", str(data), "--out", str(out), "-q", "--vectors-column", "emb",
                          "--index-factory", "RQ4x8", "--metric", "l2"], timeout=300)
    assert done.rc == 0, done.stderr[-2000:]
    return out


def test_verify_of_an_additive_quantizer_index(built: Path) -> None:
    done = forkrun.petal(["verify", str(built)])
    assert done.rc == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr


def test_verify_still_finds_another_factory_in_the_manifest(built: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(built, out)
    version = out / "versions" / (out / "CURRENT").read_text().strip()
    manifest = json.loads((version / "manifest.json").read_text())
    manifest["index"]["factory"] = "RQ2x8"  # 2 bytes a code, where the file's index has 4
    manifest.pop(CHECKSUM_KEY)
    manifest[CHECKSUM_KEY] = canonical_sha256(manifest)
    (version / "manifest.json").write_text(json.dumps(manifest, indent=2))
    done = forkrun.petal(["verify", str(out)])
    assert done.rc == 65 and "MISMATCH  index.faiss" in done.stdout, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "RQ2x8" in done.last_line, done.stderr
