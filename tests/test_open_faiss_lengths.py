"""Tampering audit of opening an index (issue 14, item 3): a damaged length inside ``index.faiss`` (an array's item
count, an IVF list's size) is 65 naming the file, found before FAISS reads it, never memory grown by it.

FAISS reads most arrays as a length, then ``resize(length)``, then the items; a length up to 2^40 items passes its
own check. So a byte changed in such a length made the open allocate, and zero-fill, what the file cannot hold: a
single byte of the HNSW neighbour count in the body of a 17 MB index of 100k vectors (past the first MiB the open
checks; not re-signed) made ``petal query`` grow to 12 GB in 24 s, still growing when it was killed. Here the lengths
are damaged in small indexes and the manifest's size and head/tail records signed again over the change (what a
change in the body of a large file looks like to an open); each command runs under a 4 GiB address-space limit, so
before the fix it ended in an allocation refused (or the limit), not 65 naming the file.

Also an id past the index in a binary IVF index's lists (the same audit's byte sweep found it): 65, as a float
index's is, not rescoring's IndexError traceback.

Real FAISS and Parquet, indexes petal builds from precomputed vectors; every command in a fresh interpreter.
"""

from __future__ import annotations

import os
import resource
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from petal.pipeline.index.faiss_layout import walked
from tests._open_audit_shared import copy_index, index_vectors, resign, vectors_shard
from tests.conftest import REPO

DIM = 8
FLOAT_HEADER = 4 + struct.calcsize("<iqqq?i")  # the tag, then d, ntotal, two dummies, is_trained, metric_type
BINARY_HEADER = 4 + struct.calcsize("<iiq?i")
FACTORIES = {"flat": "Flat", "hnsw": "HNSW8", "ivf": "IVF8,Flat", "sq": "SQ8", "binary": "BFlat",
             "opq": "OPQ4,IVF8,PQ4", "refine": "IVF8,PQ4,RFlat", "bhnsw": "BHNSW8", "bivf": "BIVF8"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("faiss-lengths")
    vectors_shard(root / "v.parquet", rows=1000, dim=DIM, seed=3)
    np.save(root / "q.npy", np.ones((1, DIM), np.float32))
    return {name: index_vectors(root / "v.parquet", root / name, "--index-factory", factory, "--metric", "l2")
            for name, factory in FACTORIES.items()}


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def petal(*argv: str) -> subprocess.CompletedProcess[str]:
    """``petal ARGV`` in a fresh interpreter under a 4 GiB address-space limit."""
    return subprocess.run([sys.executable, "-c", "from petal.cli.main import main; main()", *argv],
                          capture_output=True, text=True, cwd=REPO, timeout=300, preexec_fn=_limited,
                          env=dict(os.environ))


def _hnsw_neighbours(path: Path, header: int) -> int:
    """Where an HNSW index's neighbour count lies (after its level probabilities, neighbours per level, levels and
    offsets, each a length and its items), read from the arrays FAISS gives back."""
    import faiss

    index = faiss.downcast_index(faiss.read_index(str(path))) if header == FLOAT_HEADER else \
        faiss.read_index_binary(str(path))
    hnsw = index.hnsw
    return (header + 8 + 8 * hnsw.assign_probas.size() + 8 + 4 * hnsw.cum_nneighbor_per_level.size() + 8
            + 4 * hnsw.levels.size() + 8 + 8 * hnsw.offsets.size())


def _sq_codes(path: Path) -> int:
    """Where a scalar-quantizer index's code count lies (after its quantizer's fields and trained ranges)."""
    import faiss

    trained = faiss.downcast_index(faiss.read_index(str(path))).sq.trained.size()
    return FLOAT_HEADER + struct.calcsize("<iifQQ") + 8 + 4 * trained


def _list_size(path: Path, header: int) -> int:
    """Where the first list size of an IVF index's in-memory lists lies (``ilar``, nlist, code size, ``full``, the
    table's length, then the sizes)."""
    return path.read_bytes().index(b"ilar") + 4 + 16 + 4 + 8


# each damage: the index, where the length lies, the value written there (8 bytes: a count of items FAISS would
# allocate, under its 2^40 limit and over the file's bytes)
DAMAGE = {
    "flat vectors": ("flat", lambda p: FLOAT_HEADER, 1 << 36),
    "sq codes": ("sq", lambda p: _sq_codes(p), 1 << 38),
    "hnsw neighbours": ("hnsw", lambda p: _hnsw_neighbours(p, FLOAT_HEADER), 1 << 36),
    "ivf list size": ("ivf", lambda p: _list_size(p, FLOAT_HEADER), 1 << 34),
    "binary codes": ("binary", lambda p: BINARY_HEADER, 1 << 38),
    "binary hnsw neighbours": ("bhnsw", lambda p: _hnsw_neighbours(p, BINARY_HEADER), 1 << 36),
    "binary ivf list size": ("bivf", lambda p: _list_size(p, BINARY_HEADER), 1 << 36),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_length_is_65_naming_the_file(built: dict[str, Path], tmp_path: Path, case: str) -> None:
    name, where, value = DAMAGE[case]
    out, version = copy_index(built[name], tmp_path)
    path = version / "index.faiss"
    offset = where(path)
    blob = bytearray(path.read_bytes())
    (old,) = struct.unpack_from("<Q", blob, offset)
    assert 0 < old < 1 << 24, (case, offset, old)  # the length found where it was looked for
    struct.pack_into("<Q", blob, offset, value)
    path.write_bytes(bytes(blob))
    resign(version, sha256=False)
    q = str(built[name].parent / "q.npy")
    for argv in (["query", str(out), "--vector-file", q, "-k", "3"], ["info", str(out)]):
        done = petal(*argv)
        if argv[0] == "info" and done.returncode == 0:
            continue  # petal info reads the header only, never FAISS
        assert done.returncode == 65, (argv, done.returncode, done.stderr[-2000:])
        assert "Traceback" not in done.stderr, done.stderr[-2000:]
        last = done.stderr.strip().splitlines()[-1]
        assert "index.faiss: FAISS cannot read it: a length inside it counts more than the file holds" in last, last


def test_the_walk_reads_every_kind_petal_builds_to_its_end(built: dict[str, Path]) -> None:
    """The walk knows every part of the index kinds petal builds in memory: it reads each file to its last byte
    (a wrong reading of a field would land elsewhere, or refuse a sound index)."""
    for name, out in built.items():
        version = out / "versions" / (out / "CURRENT").read_text().strip()
        path = version / "index.faiss"
        assert walked(path) == path.stat().st_size, name


def test_a_binary_ivf_list_id_past_the_index_is_65_not_a_traceback(built: dict[str, Path], tmp_path: Path) -> None:
    """An id in a binary IVF index's list changed to one past the index (re-signed: a body change): rescoring took
    that row of rescore.npy, an IndexError traceback (exit 1); a float index's such id is 65 since IndexReader
    checks the ids FAISS returns, and so is a binary one's now, before rescoring."""
    import faiss

    out, version = copy_index(built["bivf"], tmp_path)
    path = version / "index.faiss"
    index = faiss.read_index_binary(str(path))
    lists = faiss.extract_index_binary_ivf(index).invlists if hasattr(faiss, "extract_index_binary_ivf") else \
        faiss.downcast_IndexBinary(index).invlists
    start = _list_size(path, BINARY_HEADER) + 8 * lists.nlist  # the lists' codes and ids, one list after another
    blob = bytearray(path.read_bytes())
    for number in range(lists.nlist):
        size = lists.list_size(number)
        if size:
            ids_at = start + size * lists.code_size
            (first,) = struct.unpack_from("<q", blob, ids_at)
            assert 0 <= first < index.ntotal
            struct.pack_into("<q", blob, ids_at, 65427)
            # the query: that entry's own sign bits (Hamming distance 0: it is the first candidate)
            bits = np.unpackbits(np.frombuffer(bytes(blob[start:start + lists.code_size]), np.uint8))
            np.save(tmp_path / "q.npy", np.where(bits, 1.0, -1.0).astype(np.float32)[None, :])
            break
        start += size * (lists.code_size + 8)
    path.write_bytes(bytes(blob))
    resign(version, sha256=False)
    done = petal("query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "3", "--nprobe", "8")
    assert done.returncode == 65, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "index.faiss returned vector id 65427 of 1000: the index is corrupt" in done.stderr, done.stderr[-2000:]
