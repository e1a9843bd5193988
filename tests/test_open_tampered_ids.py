"""A FAISS id in an index's body that no vector has (issue 14, item 3): a change inside the body of a large
file passes the open's head/tail checks, so a search can return it. Any id FAISS returns that is neither a
vector of the index nor its ``-1`` padding is the damage it is, 65 naming the file that holds the ids, never a
hit dropped without a word (ids below -1 were, their rank left out) or an id past the map."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.checksums import HEAD_TAIL_BYTES
from petal.pipeline.layout import OutputDir
from tests import forkrun

ROWS, DIM = 3000, 256  # 3 MB of vectors: the middle lists lie past both head/tail spans


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Real IVF indexes of precomputed vectors, the lists in index.faiss (memory) and in index.ivfdata (ondisk)."""
    root = tmp_path_factory.mktemp("tampered_ids")
    vectors = np.random.default_rng(0).standard_normal((ROWS, DIM), dtype=np.float32)
    table = pa.table({"id": np.arange(ROWS), "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM),
                      "lang": ["en"] * ROWS})
    pq.write_table(table, root / "vectors.parquet")
    outs = {}
    for storage, flags in (("memory", []), ("ondisk", ["--index-memory", "1M"])):
        out = root / storage
        run = forkrun.petal(["index", str(root / "vectors.parquet"), "--out", str(out), "-q", "--vectors-column", "emb",
                             "--index-factory", "IVF4,Flat", "--keep-columns", "lang", *flags], timeout=300)
        assert run.rc == 0, run.stderr[-2000:]
        version = OutputDir(out).version_dir(OutputDir(out).current_version())
        assert json.loads((version / "manifest.json").read_text())["index"]["storage"] == storage
        outs[storage] = out
    return outs


def _id_slot(version: Path, storage: str) -> tuple[Path, int, np.ndarray]:
    """A list entry past the head/tail spans: the file and offset of its id, and its vector."""
    from petal.pipeline.index.faiss_loader import load_faiss
    from petal.pipeline.index.files import read_index

    faiss = load_faiss()
    index = read_index(version / "index.faiss", storage)
    ivf = faiss.extract_index_ivf(index)
    lists = faiss.downcast_InvertedLists(ivf.invlists)
    if storage == "ondisk":
        path = version / "index.ivfdata"
        entries = [(lists.lists.at(i).offset, lists.lists.at(i).capacity, lists.lists.at(i).size)
                   for i in range(ivf.nlist)]
    else:  # FAISS's "ilar" block: nlist, code_size, "full", the list sizes, then each list's codes and ids
        path = version / "index.faiss"
        blob = path.read_bytes()
        start = blob.index(b"ilar")
        nlist, code_size = struct.unpack_from("<QQ", blob, start + 4)
        assert blob[start + 20 : start + 24] == b"full" and code_size == DIM * 4
        sizes = np.frombuffer(blob, np.uint64, nlist, start + 32)
        entries, offset = [], start + 32 + 8 * nlist
        for size in map(int, sizes):
            entries.append((offset, size, size))
            offset += size * (code_size + 8)
    size = path.stat().st_size
    for codes, capacity, count in entries:
        for entry in range(count):
            id_at = codes + capacity * DIM * 4 + 8 * entry
            if HEAD_TAIL_BYTES + 8 <= id_at < size - HEAD_TAIL_BYTES - 8:
                vector = np.frombuffer(path.read_bytes()[codes + entry * DIM * 4 : codes + (entry + 1) * DIM * 4],
                                       np.float32)
                return path, id_at, vector
    raise AssertionError("no list entry past the head/tail spans")


@pytest.mark.parametrize("storage", ["memory", "ondisk"])
@pytest.mark.parametrize("bad_id", [-2, -5, -(2**63), ROWS, 2**40])
def test_an_id_no_vector_has_is_refused_naming_the_file(built, storage, bad_id, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(built[storage], out)
    version = OutputDir(out).version_dir(OutputDir(out).current_version())
    path, id_at, vector = _id_slot(version, storage)
    np.save(tmp_path / "q.npy", vector[None, :])
    with open(path, "r+b") as fh:
        fh.seek(id_at)
        fh.write(struct.pack("<q", bad_id))
    query = ["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "3", "--nprobe", "4", "--json"]
    run = forkrun.petal(query, timeout=300)
    assert run.rc == 65, (run.rc, run.stdout[:500], run.stderr[-2000:])
    assert "Traceback" not in run.stderr
    assert f"{path.name} returned vector id {bad_id} of {ROWS}" in run.stderr, run.stderr[-2000:]
    # filtered: an id past the vectors is no member of the filter's bitmap (never read past it), so the damaged
    # entry is not a hit; the others are
    run = forkrun.petal([*query, "--where", "lang = 'en'"], timeout=300)
    assert run.rc == 0 and "Traceback" not in run.stderr, (run.rc, run.stderr[-2000:])
    assert len(json.loads(run.stdout)["hits"]) == 3
    assert forkrun.petal(["verify", str(out)], timeout=300).rc == 65


def test_faiss_bounds_a_bitmap_selectors_ids_by_byte():
    """What IdSelector relies on: FAISS's IDSelectorBitmap(n, bits) takes an id when ``id >> 3 < n`` (n counts the
    bitmap's bytes), reading ``bits[id >> 3]``."""
    from petal.pipeline.index.faiss_loader import load_faiss

    faiss = load_faiss()
    bits = np.full(16, 0xFF, np.uint8)
    selector = faiss.IDSelectorBitmap(8, faiss.swig_ptr(bits))
    assert selector.is_member(63) and not selector.is_member(64)


@pytest.mark.parametrize("num_vectors", [1, 7, 8, 1000, 100_003])
def test_a_filters_bitmap_bounds_ids_within_itself(num_vectors):
    """A filter's selector reads no byte past its bitmap, whatever id a damaged index returns: it was given the
    vectors' count, FAISS's bound is in bytes, so ids up to 8x the vectors read past the array."""
    from petal.pipeline.index.filters import IdSelector

    mask = np.ones(num_vectors, bool)
    ids = IdSelector(mask)
    assert int(ids.selector.n) == len(ids.bits) == (num_vectors + 7) // 8
    assert all(ids.selector.is_member(i) for i in (0, num_vectors - 1))
    assert not any(ids.selector.is_member(i) for i in (num_vectors, 8 * len(ids.bits), 8 * num_vectors - 1, -2, 2**40))
