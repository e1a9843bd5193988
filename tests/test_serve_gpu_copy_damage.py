"""``--search-device cuda``'s GPU copy of a damaged index: a stored vector made NaN or infinite by a change inside
the body of ``index.faiss`` (past the head/tail records an open checks; ``petal verify`` finds it).

The copy reads every stored vector while it uploads, so it finds such a vector before the version serves: the
version is refused as ``IndexReader`` refuses it when a search meets it (``BadInputError``, 65, naming the file and
the vector: 'the index is corrupt; run petal verify and rebuild it'). Before, a copy of every vector (a Flat index,
or ``--search-exact``) raised ``AttributeError`` ('TorchExactIndex' object has no attribute 'reconstruct': a 500 with
a traceback) on the first search that met it, and a copy of an IVF index's lists dropped it from every answer (fewer
hits than ``k``, 200). A finite stored vector whose score overflows (values near float32's largest) is no damage:
the copy answers as FAISS on the CPU does (a copy of every vector lacked the ``reconstruct`` that the reader's check
calls; a copy of the lists dropped the +inf hit as padding).

Real FAISS indexes built by ``petal index --vectors-column``, damaged in their body and signed again in sizes and
head/tail checksums; the copies run through torch on the CPU here and on CUDA when there is one; the server test
(``petal serve --search-device cuda``, a real process on a loopback port) needs CUDA.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests._open_audit_shared import resign

torch = pytest.importorskip("torch")
faiss = pytest.importorskip("faiss")

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]
ROWS, DIM = 400, 16
DAMAGED = 5


def _index(root: Path, factory: str, metric: str, rows: np.ndarray | None = None) -> Path:
    """``root/out``: ``factory`` over ROWS positive vectors (``--vectors-column``, ``--metric metric``)."""
    from click.testing import CliRunner

    from petal.cli.main import cli

    if rows is None:
        rows = np.abs(np.random.default_rng(5).standard_normal((ROWS, DIM))).astype(np.float32)
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": np.arange(len(rows)), "emb": pa.FixedSizeListArray.from_arrays(
        pa.array(rows.ravel()), rows.shape[1])}), root / "v.parquet")
    result = CliRunner().invoke(cli, ["index", str(root / "v.parquet"), "--out", str(root / "out"), "-q",
                                      "--vectors-column", "emb", "--index-factory", factory, "--metric", metric])
    assert result.exit_code == 0, result.output
    return root / "out"


def _version(out: Path) -> Path:
    return out / "versions" / (out / "CURRENT").read_text().strip()


def _damage(out: Path, vector_id: int, value: float) -> Path:
    """The stored float32 bytes of ``vector_id`` in the live version's index.faiss set to ``value``, the manifest
    signed again in sizes and head/tail checksums only (what a change in the body of a large file looks like to an
    open). Returns the damaged file."""
    path = _version(out) / "index.faiss"
    stored = faiss.read_index(str(path))
    ivf = faiss.try_extract_index_ivf(stored)
    if ivf is not None:
        ivf.make_direct_map()
    old = stored.reconstruct(vector_id).astype(np.float32).tobytes()
    blob = path.read_bytes()
    assert blob.count(old) == 1
    path.write_bytes(blob.replace(old, np.full(DIM, value, np.float32).tobytes()))
    resign(_version(out), sha256=False)
    return path


def _list_position(out: Path, vector_id: int) -> int:
    """Where ``vector_id`` sits among the IVF lists' rows, in list order (what a copy of the lists keeps)."""
    index = faiss.read_index(str(_version(out) / "index.faiss"))
    ivf = faiss.extract_index_ivf(index)  # NOTE: a view into `index`, which must outlive it
    order = np.concatenate([faiss.rev_swig_ptr(ivf.invlists.get_ids(i), ivf.invlists.list_size(i)).copy()
                            for i in range(ivf.nlist) if ivf.invlists.list_size(i)])
    return int(np.flatnonzero(order == vector_id)[0])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    root = tmp_path_factory.mktemp("copy-damage")
    return {(factory, metric): _index(root / f"{factory.replace(',', '_')}-{metric}", factory, metric)
            for factory in ("Flat", "IVF4,Flat") for metric in ("ip", "l2")}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("metric", ["ip", "l2"])
@pytest.mark.parametrize(("factory", "exact"), [("Flat", False), ("IVF4,Flat", False), ("IVF4,Flat", True)])
def test_a_damaged_stored_vector_refuses_the_copy_naming_the_file_and_the_vector(
        built: dict[tuple[str, str], Path], tmp_path: Path, factory: str, exact: bool, metric: str, value: float,
        device: str) -> None:
    from petal.pipeline.index.search import IndexReader
    from petal.pipeline.reliability.errors import BadInputError
    from petal.pipeline.serve.gpu_search import GpuReaders

    out = tmp_path / "out"
    shutil.copytree(built[factory, metric], out)
    if factory.startswith("IVF") and not exact:
        assert _list_position(out, DAMAGED) != DAMAGED  # the message names the vector's id, not its row in the copy
    path = _damage(out, DAMAGED, value)
    readers = GpuReaders(device, "float16", exact=exact)
    reader = IndexReader(out, nprobe=4)  # NOTE: opens: the damage is past what an open reads
    with pytest.raises(BadInputError) as raised:
        readers.prepare(reader)
    assert str(raised.value) == (f"{path}: vector {DAMAGED} holds NaN or infinite values: the index is corrupt; run "
                                 "petal verify and rebuild it")
    assert readers.get(reader) is None
    if metric == "ip" and np.isinf(value):  # FAISS on the CPU says the same once a search meets it (scored +inf)
        with pytest.raises(BadInputError, match=f"vector {DAMAGED} holds NaN or infinite values"):
            reader.search(np.full((1, DIM), np.sign(value), np.float32), 3)


@pytest.mark.parametrize("device", DEVICES)
def test_damage_past_the_first_upload_chunk_is_found(tmp_path: Path, device: str) -> None:
    """The copy uploads UPLOAD_ROWS (65536) rows at a time: a vector of the second chunk is named by its id."""
    from petal.pipeline.index.search import IndexReader
    from petal.pipeline.reliability.errors import BadInputError
    from petal.pipeline.serve.gpu_search import UPLOAD_ROWS, GpuReaders

    rows = np.random.default_rng(2).standard_normal((UPLOAD_ROWS + 500, DIM)).astype(np.float32)
    out = _index(tmp_path, "Flat", "ip", rows)
    odd = UPLOAD_ROWS + 321
    _damage(out, odd, np.nan)
    with pytest.raises(BadInputError, match=f": vector {odd} holds NaN or infinite values"):
        GpuReaders(device, "float16").prepare(IndexReader(out))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("factory", "exact"), [("Flat", False), ("IVF4,Flat", False), ("IVF4,Flat", True)])
def test_a_finite_vector_whose_score_overflows_is_answered_as_faiss_answers(tmp_path: Path, factory: str,
                                                                            exact: bool, device: str) -> None:
    """A stored row of 4e18s (finite, its squared norm within float32: petal index stores it; a float32 copy) under a
    query of 1e20s: its inner product is beyond float32 (inf). The reader looks at the stored vector of a hit scored
    inf (finite: the query's to scale down, said by the caller: ``petal serve`` answers 422 'scale the row down'); a
    copy of every vector had no ``reconstruct`` for that look (AttributeError), a copy of the lists took the +inf
    score for padding and dropped the hit (2 of 3). (A row of 1e37s, once used here, is now ``vector_too_large``.)"""
    from petal.pipeline.index.search import IndexReader
    from petal.pipeline.serve.gpu_search import GpuReaders

    rows = np.abs(np.random.default_rng(5).standard_normal((ROWS, DIM))).astype(np.float32)
    rows[DAMAGED] = np.float32(4e18)
    out = _index(tmp_path, factory, "ip", rows)
    reader = IndexReader(out, nprobe=4)
    readers = GpuReaders(device, "float16", exact=exact)
    readers.prepare(reader)
    copy = readers.get(reader)
    assert copy is not None and readers.describe(reader)["dtype"] == "float32"
    query = np.full((1, DIM), 1e20, np.float32)
    on_copy, on_faiss = copy.search(query, 3)[0], reader.search(query, 3)[0]
    assert [h.id for h in on_copy] == [h.id for h in on_faiss] and on_copy[0].id == DAMAGED
    assert np.isinf(on_copy[0].score) and np.isinf(on_faiss[0].score)
    assert np.isfinite([h.score for h in on_copy[1:]]).all()


def _damaged_later_version(src: Path, root: Path) -> Path:
    """A version of other rows built over a copy of ``src`` under ``root``, damaged (a NaN vector) before any server
    can see it; returns its directory, to publish into a served OUT."""
    shutil.copytree(src, root / "out")
    rows = np.abs(np.random.default_rng(6).standard_normal((ROWS, DIM))).astype(np.float32)
    _index(root, "IVF4,Flat", "ip", rows)
    _damage(root / "out", DAMAGED, np.nan)
    return _version(root / "out")


def _publish_and_wait_for_refusal(client: Any, live: Path, version: Path) -> dict[str, Any]:
    """``version`` copied into ``live`` and named by its CURRENT; ``/ready`` once it says a refusal (or after 60 s)."""
    shutil.copytree(version, live / "versions" / version.name)
    (live / "CURRENT").write_text(version.name + "\n")
    deadline = time.monotonic() + 60
    while True:
        ready: dict[str, Any] = client.get("/ready").json()
        if ready.get("refused") or time.monotonic() > deadline:
            return ready
        time.sleep(0.1)


def test_a_server_searching_a_copy_refuses_a_damaged_new_version_and_keeps_serving(tmp_path: Path) -> None:
    """A real server (in this process, on a loopback port) whose versions are searched on a copy made by torch on the
    CPU (what ``--search-device cuda`` makes on the GPU): a damaged version published is refused as 'prepare' naming
    the vector, tried again; the live version keeps serving from its copy."""
    import httpx

    pytest.importorskip("uvicorn")
    from petal.pipeline.jobs.query import SearchIndex
    from petal.pipeline.serve.gpu_search import GpuReaders
    from petal.pipeline.serve.service import ServeState
    from petal.pipeline.serve.settings import ServeSettings
    from tests._serve_shared import served_in_process

    src = _index(tmp_path / "src", "IVF4,Flat", "ip")
    later = _damaged_later_version(src, tmp_path / "later")
    live = tmp_path / "live" / "out"
    shutil.copytree(src, live)
    index = SearchIndex.open(live, None)
    state = ServeState(None, ServeSettings(reload_interval_s=0.1), index_root=live, index=index)
    state.gpu = state.searcher.gpu = GpuReaders("cpu", "float16")  # NOTE: the copy on the CPU, standing in for CUDA
    state.gpu.prepare(index.reader)
    with served_in_process(state) as url, httpx.Client(base_url=url, timeout=60) as client:
        before = client.get("/ready").json()
        assert before["search"] == {"device": "cpu", "copy": "lists", "dtype": "float16"}, before
        ready = _publish_and_wait_for_refusal(client, live, later)
        assert ready["version"] == before["version"] and ready["search"]["copy"] == "lists", ready
        refused = ready["refused"]
        assert (refused["version"], refused["reason"]) == (later.name, "prepare") and "retry_in_s" in refused, refused
        assert refused["message"] == (f"cannot prepare {later.name}: {live / 'versions' / later.name / 'index.faiss'}: "
                                      f"vector {DAMAGED} holds NaN or infinite values: the index is corrupt; run "
                                      "petal verify and rebuild it"), refused
        answer = client.post("/search", json={"vectors": [[1.0] * DIM], "k": 3})
        assert answer.status_code == 200 and len(answer.json()["results"][0]["hits"]) == 3, answer.text
        assert answer.json()["version"] == before["version"]


@CUDA
def test_serve_refuses_a_damaged_index_at_start_and_a_damaged_new_version(tmp_path: Path) -> None:
    """``petal serve OUT --search-device cuda`` on an index whose body holds a NaN vector: exit 65 naming the file and
    the vector, no traceback. Serving a sound version, a damaged one published: refused ('prepare', tried again),
    the sound one keeps serving and answers."""
    import subprocess
    import sys

    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from tests.test_serve import Server

    src = _index(tmp_path / "src", "IVF4,Flat", "ip")
    out = tmp_path / "bad" / "out"
    shutil.copytree(src, out)
    path = _damage(out, DAMAGED, np.nan)
    done = subprocess.run([sys.executable, "-m", "petal.cli.main", "serve", str(out), "--port", "0",
                           "--search-device", "cuda"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 65, (done.returncode, done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr
    assert f"{path}: vector {DAMAGED} holds NaN or infinite values" in done.stderr, done.stderr

    later = _damaged_later_version(src, tmp_path / "later")
    live = tmp_path / "live" / "out"
    shutil.copytree(src, live)
    server = Server(tmp_path / "server.log", live, "--search-device", "cuda", "--reload-interval-s", "0.1")
    try:
        sound = server.client.get("/ready").json()["version"]
        ready = _publish_and_wait_for_refusal(server.client, live, later)
        assert ready["version"] == sound, ready
        refused = ready["refused"]
        assert (refused["version"], refused["reason"]) == (later.name, "prepare"), refused
        assert f"vector {DAMAGED} holds NaN or infinite values" in refused["message"], refused
        answer = server.client.post("/search", json={"vectors": [[1.0] * DIM], "k": 3})
        assert answer.status_code == 200 and len(answer.json()["results"][0]["hits"]) == 3, answer.text
    finally:
        server.stop()
    assert "Traceback" not in (tmp_path / "server.log").read_text()
