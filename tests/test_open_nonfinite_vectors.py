"""Tampering audit of opening an index (issue 14, item 3): a stored vector made NaN or infinite by a change inside the
body of a file (the open checks read sizes, heads and tails: only ``petal verify`` reads every byte) is said as the
index's damage when a search meets it, 65 naming the file that holds it, whatever the query (text, ``--vector-file``,
the Python API) and the index kind; never the query's fault, never ``nan`` scores printed as an answer.

petal never stores such a vector (a run refuses NaN and infinite embeddings), so a hit scored NaN or infinite for a
finite query whose stored vector is not finite is damage. Before, a text query printed ``nan`` scores (exit 0, with
numpy's RuntimeWarning on stderr), ``petal query --vector-file`` said the query file's row was 'too large for the
index's vectors; scale it down' (65 naming the query file) and the Python API's ``search_stored`` raised
``ScoresOverflowError``, a usage error (2).

Real FAISS and Parquet, indexes petal builds (``--vectors-column``; the text index with the tests' fake engine, queried
by the packaged MiniLM); the damage written into the file's body and the manifest's size and head/tail records
signed again over it (what a change past the first and last MiB of a large file looks like to an open); every
command in its own process (tests/forkrun.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import forkrun
from tests._open_audit_shared import api, copy_index, index_vectors, resign

ROWS, DIM = 400, 16
DAMAGED = 5  # the row whose stored vector is made infinite


def _positive_index(root: Path, factory: str) -> Path:
    """``root/out``: ``factory`` over ROWS positive vectors (``--vectors-column``), beside ``root/q.npy`` (ones), so
    a query of ones scores a vector made +inf first."""
    flat = np.abs(np.random.default_rng(5).standard_normal((ROWS, DIM))).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(ROWS), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()),
                                                                                          DIM)}), root / "v.parquet")
    np.save(root / "q.npy", np.ones((2, DIM), np.float32))
    return index_vectors(root / "v.parquet", root / "out", "--index-factory", factory)


def _damage(version: Path, name: str, old: bytes, new: bytes) -> None:
    """``old`` (the stored bytes of one vector, found once in ``version/name``) overwritten with ``new``, the
    manifest's size and head/tail records signed again (a body change only ``petal verify`` finds)."""
    path = version / name
    blob = path.read_bytes()
    assert blob.count(old) == 1
    path.write_bytes(blob.replace(old, new))
    resign(version, sha256=False)


def _refused(run: forkrun.Result, name: str) -> None:
    assert run.rc == 65, (run.rc, run.stdout[-500:], run.stderr[-2000:])
    assert "Traceback" not in run.stderr and "RuntimeWarning" not in run.stderr, run.stderr
    assert f"{name}: vector {DAMAGED} holds NaN or infinite values" in run.last_line, run.last_line
    assert "the index is corrupt; run petal verify" in run.last_line, run.last_line
    assert not run.stdout, run.stdout


@pytest.fixture(scope="module")
def positive(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nonfinite")
    built = {}
    for factory in ("Flat", "IVF4,Flat"):
        home = root / factory.replace(",", "_")
        home.mkdir()
        built[factory] = _positive_index(home, factory)
    return built


@pytest.mark.parametrize("factory", ["Flat", "IVF4,Flat"])
def test_an_infinite_stored_vector_is_the_index_s_damage(positive: dict[str, Path], tmp_path: Path,
                                                         factory: str) -> None:
    from petal.pipeline.index.faiss_loader import load_faiss

    out, version = copy_index(positive[factory], tmp_path)
    stored = load_faiss().read_index(str(version / "index.faiss"))
    if factory.startswith("IVF"):
        load_faiss().extract_index_ivf(stored).make_direct_map()
    old = stored.reconstruct(DAMAGED).astype(np.float32).tobytes()
    _damage(version, "index.faiss", old, np.full(DIM, np.inf, np.float32).tobytes())
    q = str(positive[factory].parent / "q.npy")
    for flags in ([], ["--json"]):
        _refused(forkrun.petal(["query", str(out), "--vector-file", q, "-k", "3", "--nprobe", "4", *flags]),
                 "index.faiss")
    done = api(out)
    assert done.returncode == 65, (done.returncode, done.stderr[-2000:])
    assert f"index.faiss: vector {DAMAGED} holds NaN or infinite values" in done.stderr, done.stderr
    verify = forkrun.petal(["verify", str(out)])
    assert verify.rc == 65 and "index.faiss" in verify.last_line, verify.stderr


def test_a_nan_region_under_a_text_query_is_65_not_nan_scores(tmp_path: Path) -> None:
    """Every stored vector of a Flat index overwritten with NaN bytes (a region of the body zeroed the other way):
    a text query (MiniLM) printed every hit with score nan, exit 0."""
    from petal.engine.loader import default_model_dir
    from petal.pipeline.index.faiss_loader import load_faiss

    texts = [f"document {i} about glaciers and bread" for i in range(40)]
    pq.write_table(pa.table({"id": np.arange(40), "text": texts}), tmp_path / "docs.parquet")
    out = tmp_path / "out"
    built = forkrun.petal(["index", str(tmp_path / "docs.parquet"), "--out", str(out), "-q", "--index-factory", "Flat",
                           "--model", str(default_model_dir())], env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log")})
    assert built.rc == 0, built.stderr[-2000:]
    version = out / "versions" / (out / "CURRENT").read_text().strip()
    stored = load_faiss().read_index(str(version / "index.faiss"))
    old = stored.reconstruct_n(0, stored.ntotal).astype(np.float32).tobytes()
    path = version / "index.faiss"
    blob = path.read_bytes()
    assert blob.count(old) == 1
    path.write_bytes(blob.replace(old, b"\xff" * len(old)))
    resign(version, sha256=False)
    run = forkrun.petal(["query", str(out), "glaciers", "-k", "3"])
    assert run.rc == 65, (run.rc, run.stdout[-500:], run.stderr[-2000:])
    assert "index.faiss: vector " in run.last_line and "holds NaN or infinite values" in run.last_line, run.stderr
    assert "RuntimeWarning" not in run.stderr and "nan" not in run.stdout, (run.stdout, run.stderr)


def test_an_infinite_rescoring_row_is_the_index_s_damage(tmp_path: Path) -> None:
    """A binary index's rescoring row (rescore.npy, float16) made infinite: its hit scored inf."""
    from tests.conftest import SAMPLE_DATA
    from tests.fake_engine import make_fake_model_dir

    model = make_fake_model_dir(tmp_path / "model", dim=384)
    out = tmp_path / "out"
    built = forkrun.petal(["index", str(SAMPLE_DATA / "shard-000.parquet"), "--out", str(out), "-q", "--quantize",
                           "binary", "--model", str(model)], env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log")})
    assert built.rc == 0, built.stderr[-2000:]
    version = out / "versions" / (out / "CURRENT").read_text().strip()
    rows = np.load(version / "rescore.npy")
    query = np.sign(rows[DAMAGED].astype(np.float32)) + (rows[DAMAGED] == 0)
    np.save(tmp_path / "q.npy", query[None, :])
    row = np.where(rows[DAMAGED] >= 0, np.float16(np.inf), np.float16(-np.inf)).astype(np.float16)
    _damage(version, "rescore.npy", rows[DAMAGED].tobytes(), row.tobytes())
    _refused(forkrun.petal(["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "3"]), "rescore.npy")
