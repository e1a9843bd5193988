"""Reading a published version: a failure of the host is 74, never "the version is corrupt" (65).

Out of memory while a search decodes a row group of ``ids.parquet`` (pyarrow's ``ArrowMemoryError``), a memory map
the host refuses (ENOMEM) for ``ids.parquet``'s footer or for ``index.faiss``: each was 65, "the version is corrupt:
run petal verify and rebuild it", about an index that is whole. Reproduced for real: ``RLIMIT_AS`` set in a child
forked from the preloaded forkserver, over a small index petal builds. The maps are refused by padding the file with a
sparse hole (a few GiB, no disk) where its reader never looks (before a Parquet footer, after a FAISS index), the
records signed again over it: a valid file larger than the address space left.

Reading ``CURRENT`` or ``manifest.json`` failed by the host (EMFILE, EIO) was 78, a damaged output directory ("point
CURRENT at a complete version"): now 74 too; and a manifest read no longer allocates its 64 MiB limit up front.

And a manifest signed again with a huge ``integrity.head_tail_bytes`` is refused (78 naming the key): it sized each
open's reads (whole multi-GB files hashed, read into memory in one piece); the checksums read in bounded chunks.
"""

from __future__ import annotations

import io
import os
import resource
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import forkrun
from tests._open_audit_shared import copy_index, index_vectors, resign, signed_manifest, vectors_shard

ROWS, DIM, BLOB = 64, 8, 1 << 20  # ids.parquet's kept column: 64 MiB decoded, a few KiB on disk (a dictionary)
HOLE = 4 << 30


def _vm_size() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))


def _limit(margin: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_vm_size() + margin, resource.RLIM_INFINITY))


def _exit_with(exc: BaseException) -> None:
    from petal.pipeline.reliability.errors import PetalError

    if not isinstance(exc, PetalError):
        raise exc
    print(exc, file=sys.stderr)
    sys.exit(exc.exit_code)


def _search_short_of_memory(out: str) -> None:
    """Open ``out``, then search with 4 MiB of address space to spare: the hits' row group decodes more (a row group of
    ids.parquet holds up to max_batch_bytes / 8, 8 MiB, since fc70623; with 16 MiB to spare it could fit)."""
    import petal

    pa.set_memory_pool(pa.system_memory_pool())  # NOTE: malloc: a refused allocation is refused, not retained
    try:
        with petal.open_index(out) as index:
            index.reader.id_map.rows.read_group(0, ["id"])  # pyarrow's reader threads started while memory is there
            _limit(4 << 20)
            index.search_stored(np.ones((1, index.dim), np.float32), k=2)
    except Exception as exc:
        _exit_with(exc)


def _open_short_of_address_space(out: str) -> None:
    """``petal.open_index(out)`` with 512 MiB of address space to spare (a map of a 4 GiB file is refused)."""
    import petal

    try:
        _limit(512 << 20)
        with petal.open_index(out) as index:
            index.search_stored(np.ones((1, index.dim), np.float32), k=2)
    except Exception as exc:
        _exit_with(exc)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("host-failures")
    flat = np.random.default_rng(3).standard_normal((ROWS, DIM)).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(ROWS), "blob": ["a" * BLOB] * ROWS,
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), DIM)}),
                   root / "v.parquet")
    return index_vectors(root / "v.parquet", root / "out", "--keep-columns", "blob")


def _assert_host_failure(rc: int, stderr: str, path: str) -> None:
    assert rc == 74, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert path in last and "corrupt" not in last and "rebuild" not in last, last


def test_out_of_memory_decoding_a_row_group_is_74(built: Path) -> None:
    """A search's row group decode refused memory (ArrowMemoryError): was 65, 'the version is corrupt'."""
    rc, stderr = forkrun.call(_search_short_of_memory, (str(built),))
    # NOTE: whichever allocation is refused: a row group's decode, or the hits' rows taken out of it (ids.parquet is
    # written in row groups of max_batch_bytes / 8 since fc70623: a group may decode within what is left)
    _assert_host_failure(rc, stderr, "ids.parquet: cannot read ")
    last = stderr.strip().splitlines()[-1]
    assert "out of memory" in last or "the host failed, not the file" in last, last  # a thread's stack: the latter


def _hole_before_footer(path: Path) -> None:
    """``path`` (Parquet) with a sparse hole of ``HOLE`` bytes before its footer: the column chunks keep their
    offsets, the footer is found from the end, so the file reads as before."""
    data = path.read_bytes()
    footer = int.from_bytes(data[-8:-4], "little") + 8
    with open(path, "r+b") as fh:
        fh.truncate(len(data) - footer + HOLE)
        fh.seek(len(data) - footer + HOLE)
        fh.write(data[-footer:])


def test_a_map_the_host_refuses_for_the_ids_is_74(built: Path, tmp_path: Path) -> None:
    """ENOMEM mapping ids.parquet (``pa.memory_map``): was 65, 'cannot read its Parquet footer'."""
    out, version = copy_index(built, tmp_path)
    _hole_before_footer(version / "ids.parquet")
    assert pq.ParquetFile(version / "ids.parquet").metadata.num_rows == ROWS  # a valid file
    resign(version, sha256=False)
    rc, stderr = forkrun.call(_open_short_of_address_space, (str(out),))
    _assert_host_failure(rc, stderr, "ids.parquet: cannot read its Parquet footer")


def _read_ondisk_without_descriptors(path: str) -> None:
    """FAISS reads the on-disk index at ``path`` (``files.read_index``, as opening does) with no file descriptor left
    (every one below ``RLIMIT_NOFILE`` taken): FAISS's 'could not open ... for reading: Too many open files'."""
    import petal.pipeline.index.mmap  # imported while descriptors are there
    import petal.pipeline.index.read_errors
    import petal.pipeline.index.structure
    import petal.pipeline.layout  # noqa: F401
    from petal.pipeline.index.files import read_index

    _take_descriptors()
    try:
        read_index(Path(path), "ondisk")
    except Exception as exc:
        _exit_with(exc)


def test_faiss_out_of_descriptors_is_74(tmp_path_factory: pytest.TempPathFactory) -> None:
    """EMFILE while FAISS opens an on-disk index: was 65, 'FAISS cannot read it ...; the index is corrupt'."""
    root = tmp_path_factory.mktemp("ondisk")
    vectors_shard(root / "v.parquet", rows=6000, dim=64, seed=5)
    out = index_vectors(root / "v.parquet", root / "out", "--index-factory", "IVF16,Flat", "--index-memory", "1M")
    version = out / "versions" / (out / "CURRENT").read_text().strip()
    assert (version / "index.ivfdata").is_file()
    rc, stderr = forkrun.call(_read_ondisk_without_descriptors, (str(version / "index.faiss"),))
    _assert_host_failure(rc, stderr, "index.faiss: cannot read it with FAISS: Too many open files")


def test_a_huge_head_tail_span_is_refused(built: Path, tmp_path: Path) -> None:
    """A manifest signed again with ``head_tail_bytes`` 2^40: every open hashed (and held) whole files; now 78
    naming the key, by opening and petal verify alike."""
    from petal.pipeline.index.checksums import head_tail_sha256

    out, version = copy_index(built, tmp_path)
    with signed_manifest(version) as manifest:
        manifest["integrity"]["head_tail_bytes"] = 1 << 40
        for name, record in manifest["integrity"]["files"].items():
            record["head_tail_sha256"] = head_tail_sha256(version / name, record["size"], 1 << 40)
    rc, stderr = forkrun.call(_open_short_of_address_space, (str(out),))
    assert rc == 78 and "integrity.head_tail_bytes" in stderr and "at most" in stderr, stderr[-2000:]
    done = forkrun.petal(["verify", str(out)])
    assert done.rc == 78 and "integrity.head_tail_bytes" in done.stderr, done.stderr[-2000:]


class _Reads(io.BytesIO):
    """A file whose largest read is recorded."""

    largest = 0

    def read(self, size: int | None = -1) -> bytes:
        self.largest = max(self.largest, size if size is not None and size >= 0 else len(self.getvalue()))
        return super().read(size)


def test_head_tail_checksum_reads_in_bounded_chunks() -> None:
    """Same checksum as one read, never a read larger than ``READ_CHUNK`` (a 64 MiB span held 128 MiB at once)."""
    import hashlib

    from petal.pipeline.index.checksums import READ_CHUNK, head_tail_sha256_of

    data = np.random.default_rng(0).bytes(3 * READ_CHUNK + 5)
    for span in (READ_CHUNK + 3, len(data)):
        fh = _Reads(data)
        got = head_tail_sha256_of(fh, len(data), span)
        expected = hashlib.sha256(len(data).to_bytes(8, "little"))
        expected.update(data if len(data) <= 2 * span else data[:span] + data[-span:])
        assert got == expected.hexdigest() and fh.largest <= READ_CHUNK


def _take_descriptors() -> list[int]:
    """Every file descriptor this process may still open (``RLIMIT_NOFILE`` lowered to just above those open)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(int(fd) for fd in os.listdir("/proc/self/fd")) + 8,
                                                resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    taken = []
    try:
        while True:
            taken.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        return taken


def _open_without_descriptors(path: str) -> None:
    import petal
    import petal.pipeline.index.read_errors
    import petal.pipeline.jobs.searcher

    _take_descriptors()
    try:
        petal.open_index(path)
    except Exception as exc:
        _exit_with(exc)


@pytest.mark.parametrize("target", ["out", "version"])
def test_pointer_or_manifest_the_host_cannot_read_is_74(built: Path, target: str) -> None:
    """EMFILE reading ``CURRENT`` (an output directory) or ``manifest.json`` (a version directory): was 78, 'cannot
    read ...' (a version directory: 'the version is damaged: rebuild it')."""
    version = built / "versions" / (built / "CURRENT").read_text().strip()
    rc, stderr = forkrun.call(_open_without_descriptors, (str(built if target == "out" else version),))
    _assert_host_failure(rc, stderr, "CURRENT: Too many open files" if target == "out"
                         else "manifest.json: Too many open files")


def _open_with_little_address_space(out: str) -> None:
    import petal

    _limit(32 << 20)
    with petal.open_index(out):
        pass


def test_opening_reads_the_manifest_without_a_buffer_of_its_limit(built: Path) -> None:
    """The manifest was read with ``read(64 MiB)``, a 64 MiB allocation for a file of a few KiB: an open with 32 MiB
    of address space to spare was a MemoryError traceback (exit 1)."""
    rc, stderr = forkrun.call(_open_with_little_address_space, (str(built),))
    assert rc == 0, stderr[-2000:]


def _search_hnsw_with_a_gigabyte(out: str) -> None:
    """Open ``out`` and search it with 1 GiB of address space to spare; the hits' ids on stderr."""
    import petal

    try:
        _limit(1 << 30)
        with petal.open_index(out) as index:
            hits = index.reader.search(np.load(Path(out).parent / "q.npy"), k=5)
        print(" ".join(str(h.id) for h in hits[0]), file=sys.stderr)
    except Exception as exc:
        _exit_with(exc)


def test_a_huge_efsearch_does_not_size_every_search(tmp_path: Path) -> None:
    """A manifest signed again with ``index.search_params.efSearch`` 2^31-1 (opening takes 1 to 2^31-1): FAISS sized
    each search's heaps by it, 16 GiB and 34 s a query of a 300-vector index (under a 1 GiB limit: out of memory).
    Bounded by the vectors the graph holds, which changes no result: the hits are those of efSearch 300."""
    from tests._open_audit_shared import vectors_index

    out = vectors_index(tmp_path, "--index-factory", "HNSW16", rows=300, dim=16, seed=9)
    version = out / "versions" / (out / "CURRENT").read_text().strip()
    answers = {}
    for ef in (300, (1 << 31) - 1):
        with signed_manifest(version) as manifest:
            manifest["index"]["search_params"] = {"efSearch": ef}
        rc, stderr = forkrun.call(_search_hnsw_with_a_gigabyte, (str(out),))
        assert rc == 0, stderr[-2000:]
        answers[ef] = stderr.strip().splitlines()[-1]
    assert answers[300] == answers[(1 << 31) - 1], answers


def test_a_huge_refine_k_factor_does_not_size_every_search(tmp_path: Path) -> None:
    """A manifest signed again with a refine wrapper's ``k_factor_rf`` 2^31-1: FAISS asks the base index for k x that
    many candidates a query (gigabytes; under a 1 GiB limit out of memory). Bounded by the vectors held, which changes
    no result: the hits are those of a factor that re-ranks every vector."""
    from tests._open_audit_shared import vectors_index

    out = vectors_index(tmp_path, "--index-factory", "IVF4,PQ4,RFlat", rows=300, dim=16, seed=9)
    version = out / "versions" / (out / "CURRENT").read_text().strip()
    answers = {}
    for factor in (300, (1 << 31) - 1):
        with signed_manifest(version) as manifest:
            manifest["index"]["search_params"] = {**manifest["index"]["search_params"], "k_factor_rf": factor}
        rc, stderr = forkrun.call(_search_hnsw_with_a_gigabyte, (str(out),))
        assert rc == 0, stderr[-2000:]
        answers[factor] = stderr.strip().splitlines()[-1]
    assert answers[300] == answers[(1 << 31) - 1], answers


def _reopen_after_a_host_failure(out: str, old: str, new: str) -> None:
    """An ``Index`` on version ``old``; CURRENT then names ``new`` (as a publish does); ``reopened()`` with 512 MiB of
    address space to spare (``new``'s ids.parquet cannot be mapped), then again without the limit. Prints the first
    call's exit code and the second call's version."""
    import petal
    from petal.pipeline.reliability.errors import PetalError

    index = petal.open_index(out)
    assert index.reader.dir.name == old, index.reader.dir
    tmp = Path(out) / "CURRENT.tmp"
    tmp.write_text(new + "\n")
    os.replace(tmp, Path(out) / "CURRENT")
    _limit(512 << 20)
    try:
        index.reopened()
    except PetalError as exc:
        code = exc.exit_code
    else:
        code = 0
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    fresh = index.reopened()
    print(code, "none" if fresh is None else fresh.reader.dir.name, file=sys.stderr)


def test_reopened_tries_a_version_again_after_the_host_failed_it(built: Path, tmp_path: Path) -> None:
    """``Index.reopened()`` marked a version it could not open as refused for good, whatever the reason: one the
    host failed (a memory map refused: 74) was never tried again by a long-lived ``Index`` (``petal query
    --stdin``). Now only a version found damaged is."""
    out, version = copy_index(built, tmp_path)
    done = forkrun.petal(["rebuild", str(out)])
    assert done.rc == 0, done.stderr[-2000:]
    new = (out / "CURRENT").read_text().strip()
    assert new != version.name and version.is_dir()
    _hole_before_footer(out / "versions" / new / "ids.parquet")  # a valid file larger than the address space left
    resign(out / "versions" / new, sha256=False)
    (out / "CURRENT").write_text(version.name + "\n")  # NOTE: the documented way back, so the child opens the old
    rc, stderr = forkrun.call(_reopen_after_a_host_failure, (str(out), version.name, new))
    assert rc == 0 and stderr.strip().splitlines()[-1] == f"74 {new}", stderr[-2000:]


def test_a_requests_nprobe_does_not_size_the_quantizer_search(tmp_path: Path) -> None:
    """``petal serve``'s per-request ``nprobe`` (up to 2^31-1) set an HNSW quantizer's efSearch to 2 x nprobe: a
    request with nprobe 10^9 made FAISS size its heaps for 2 x 10^9 entries (16 GiB). Now bounded by the lists (or
    65536), and the answer is the one of nprobe = every list."""
    from petal.pipeline.index.faiss_loader import load_faiss
    from petal.pipeline.index.search import EF_FLOOR, IndexReader
    from petal.pipeline.serve.searching import search_params
    from tests._open_audit_shared import vectors_index

    out = vectors_index(tmp_path, "--index-factory", "IVF8_HNSW8,Flat", rows=300, dim=16, seed=4)
    reader = IndexReader(out)
    queries = np.load(tmp_path / "q.npy")
    faiss = load_faiss()
    quantizer = faiss.downcast_index(faiss.extract_index_ivf(reader.index).quantizer)
    with search_params(reader, 8, None):
        every_list = reader.search(queries, k=5)
    with search_params(reader, 10**9, None):
        assert quantizer.hnsw.efSearch <= EF_FLOOR, quantizer.hnsw.efSearch
        assert reader.search(queries, k=5) == every_list


def test_out_of_memory_taking_the_hits_rows_is_74(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows taken out of decoded row groups are allocations too: a refused one (ArrowMemoryError, injected here
    where the parts are joined) is the host's failure, 74 naming the file. Was a raw ArrowMemoryError traceback (exit
    1), once ids.parquet's row groups were small enough to decode within the memory left (fc70623)."""
    from petal.pipeline.index import row_groups
    from petal.pipeline.reliability.errors import PetalError

    path = tmp_path / "ids.parquet"
    pq.write_table(pa.table({"id": np.arange(100), "text": [f"t{i}" for i in range(100)]}), path, row_group_size=10)
    rows = row_groups.RowGroups(pq.ParquetFile(path), path)
    assert rows.take(np.array([55, 3, 55]), ["id"]).column("id").to_pylist() == [55, 3, 55]

    def refused(*_: object, **__: object) -> None:
        raise pa.ArrowMemoryError("malloc of size 2097152 failed")

    monkeypatch.setattr(row_groups.pa, "concat_tables", refused)
    with pytest.raises(PetalError) as failed:
        rows.take(np.array([55, 3]), ["id", "text"])
    assert failed.value.exit_code == 74 and "ids.parquet" in str(failed.value), str(failed.value)
    assert "out of memory" in str(failed.value) and "corrupt" not in str(failed.value)
