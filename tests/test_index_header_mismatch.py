"""``index.faiss`` replaced by another valid FAISS index under a manifest signed again over it (every checksum
matches) is refused by every command, 65 naming the file and what differs, never answered as the manifest describes.

Before: ``petal verify`` (which promises to check every byte) and ``petal info`` passed every such version; opening
(``petal query``) found another dimension or vector count, but answered an index of the other metric (its scores
read as the manifest's) and failed on another kind with FAISS's own 'could not set' parameter message. Now opening and
``petal info`` read the file's FAISS header (O(1), no FAISS) and compare its binary/float kind, dimension, vector count
and metric with the manifest; ``petal verify`` also reads the index as opening does and compares its structure with
the manifest's factory, and the id count with its vectors.

Real ``petal`` processes, real FAISS files written over a real index's, manifests signed again as an editor would.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.layout import OutputDir
from tests._open_audit_shared import signed_manifest
from tests.conftest import REPO
from tests.test_open_audit_tamper import resign

ROWS, DIM = 40, 8


def petal(*argv: object) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, timeout=300, stdin=subprocess.DEVNULL)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("header")
    flat = np.random.default_rng(3).standard_normal((6000, 64)).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(ROWS), "emb": pa.FixedSizeListArray.from_arrays(
        pa.array(flat[:ROWS, :DIM].ravel()), DIM)}), root / "v.parquet")
    pq.write_table(pa.table({"id": np.arange(6000), "emb": pa.FixedSizeListArray.from_arrays(
        pa.array(flat.ravel()), 64)}), root / "wide.parquet")
    np.save(root / "q.npy", np.ones((1, DIM), np.float32))
    for name, data, flags in (("flat", "v", []), ("ivf", "v", ["--index-factory", "IVF2,Flat"]),
                              ("l2", "v", ["--metric", "l2"]), ("hnsw", "v", ["--index-factory", "HNSW8"]),
                              ("pca", "v", ["--index-factory", "PCA4,Flat"]),
                              ("ondisk", "wide", ["--index-factory", "IVF16,Flat", "--index-memory", "1M"])):
        proc = petal("index", root / f"{data}.parquet", "--out", root / name, "-q", "--vectors-column", "emb", *flags)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return root


@pytest.mark.parametrize("name", ["flat", "ivf", "l2", "hnsw", "pca", "ondisk"])
def test_a_version_as_petal_wrote_it_passes_every_check(built, name):
    for argv in (["verify", built / name], ["info", built / name]):
        proc = petal(*argv)
        assert proc.returncode == 0, (argv, proc.stderr[-2000:])


def replaced(built: Path, name: str, tmp_path: Path, index) -> tuple[Path, Path]:
    """A copy of index ``name`` whose index.faiss is ``index``, every checksum of the manifest written again."""
    out = tmp_path / "out"
    shutil.copytree(built / name, out)
    version = out / "versions" / str(OutputDir(out).current_version())
    faiss = load_faiss()
    (faiss.write_index_binary if isinstance(index, faiss.IndexBinary) else faiss.write_index)(
        index, str(version / "index.faiss"))
    resign(version, sha256=True)
    return out, version / "index.faiss"


def flat_index(dim: int, rows: int, metric: str = "ip"):
    faiss = load_faiss()
    index = faiss.IndexFlatIP(dim) if metric == "ip" else faiss.IndexFlatL2(dim)
    index.add(np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32))
    return index


def binary_index():
    faiss = load_faiss()
    index = faiss.IndexBinaryFlat(DIM)
    index.add(np.zeros((ROWS, DIM // 8), np.uint8))
    return index


# (index kept, index.faiss written in its place, words of the refusal): what the header says against the manifest
HEADER_CASES = {
    "dim": ("flat", lambda: flat_index(16, ROWS), "dim 16, the manifest (dim) 8"),
    "ntotal": ("flat", lambda: flat_index(DIM, ROWS + 5), "ntotal 45, the manifest (index.num_vectors) 40"),
    "metric": ("flat", lambda: flat_index(DIM, ROWS, "l2"), "metric l2, the manifest (index.metric) ip"),
    "metric-l2": ("l2", lambda: flat_index(DIM, ROWS, "ip"), "metric ip, the manifest (index.metric) l2"),
    "binary": ("flat", binary_index, "a binary (Hamming) index (IBxF), the manifest a float one"),
}


@pytest.mark.parametrize("case", list(HEADER_CASES))
def test_another_index_under_a_manifest_signed_again_is_65_in_every_command(built, tmp_path, case):
    name, make, words = HEADER_CASES[case]
    out, index_file = replaced(built, name, tmp_path, make())
    for argv in (["verify", out], ["info", out], ["info", out, "--json"],
                 ["query", out, "--vector-file", built / "q.npy"]):
        proc = petal(*argv)
        assert proc.returncode == 65, (argv, proc.returncode, proc.stderr[-2000:])
        last = proc.stderr.strip().splitlines()[-1]
        assert str(index_file) in last and "FAISS header says" in last and words in last, (argv, last)


def test_verify_compares_the_index_kind_with_the_manifests_factory(built, tmp_path):
    """A Flat index of the same dimension, vector count and metric under a manifest saying IVF2,Flat (the header
    agrees: opening reads it, then fails setting nprobe): petal verify reads the index and names both kinds."""
    out, _ = replaced(built, "ivf", tmp_path, flat_index(DIM, ROWS))
    proc = petal("verify", out)
    assert proc.returncode == 65, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "index.faiss (FAISS reads IndexFlatIP(d=8" in last and '"IVF2,Flat" makes IndexIVFFlat(d=8, 2 lists' in last
    assert "MISMATCH  index.faiss" in proc.stdout


def test_verify_compares_the_ids_with_the_vectors(built, tmp_path):
    """ids.parquet of another row count, signed again: opening refused it ('N ids for M vectors'), verify passed."""
    out = tmp_path / "out"
    shutil.copytree(built / "flat", out)
    version = out / "versions" / str(OutputDir(out).current_version())
    ids = pq.read_table(version / "ids.parquet")
    pq.write_table(ids.slice(0, ROWS - 1), version / "ids.parquet")
    resign(version, sha256=True)
    proc = petal("verify", out)
    assert proc.returncode == 65, proc.stderr[-2000:]
    assert "ids.parquet (maps 39 ids for the 40 vectors of index.faiss)" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(("name", "metric"), [("flat", "l2"), ("l2", "ip"), ("ondisk", "l2")])
def test_a_manifest_whose_metrics_disagree_is_refused_78(built, tmp_path, name, metric):
    """The top-level metric (what searching ranks by) edited against index.metric (what the header is checked
    against), signed again: verify passed and queries ranked hits backwards."""
    out = tmp_path / "out"
    shutil.copytree(built / name, out)
    version = out / "versions" / str(OutputDir(out).current_version())
    with signed_manifest(version) as manifest:
        manifest["metric"] = metric
    for argv in (["verify", out], ["info", out], ["query", out, "--vector-file", built / "q.npy"]):
        proc = petal(*argv)
        assert proc.returncode == 78, (argv, proc.returncode, proc.stderr[-2000:])
        assert "metric" in proc.stderr.strip().splitlines()[-1] and "disagree" in proc.stderr, proc.stderr[-2000:]
