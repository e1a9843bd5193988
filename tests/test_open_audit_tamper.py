"""Tampering audit of opening an index (issue 14, item 3): cases that reached FAISS or numpy past the cheap
checks (a manifest re-signed over changed files, or a change the head/tail checksum does not see) end in a
clear error with the documented exit code, never a crash, a traceback or a hang.

Real FAISS, real Parquet, a binary index of sample_data built by petal with the tests' fake engine
(tests/fake_cli.py: what is checked is how the files are read, not the model's numbers); every command runs in its
own process (petal's CLI forked from a preloaded interpreter, tests/forkrun.py), so a crash (SIGBUS, SIGSEGV) fails
the test instead of ending the test run.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from petal.pipeline.layout import OutputDir
from tests import forkrun
from tests._open_audit_shared import api, copy_index, index_vectors, resign, signed_manifest, vectors_shard
from tests.conftest import SAMPLE_DATA
from tests.fake_engine import make_fake_model_dir


def petal(*argv: str, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
    """``petal ARGV`` in its own process (forked from a preloaded interpreter: tests/forkrun.py), as a
    ``CompletedProcess`` for ``refused``."""
    run = forkrun.petal(list(argv), env=env, timeout=300)
    return subprocess.CompletedProcess(["petal", *argv], run.rc, run.stdout, run.stderr)


def refused(proc: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """``proc`` ended with ``code`` and one clear last line on stderr holding ``words``; returns that line."""
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in last, last
    return last


def vectors_index(root: Path, name: str, factory: str, *extra: str, rows: int = 6000, dim: int = 64) -> Path:
    data = root / f"{name}.parquet"
    vectors_shard(data, rows=rows, dim=dim, seed=7, lang=[("en", "de", "fr")[i % 3] for i in range(rows)])
    return index_vectors(data, root / name, "--index-factory", factory, "--keep-columns", "lang", *extra)


@pytest.fixture(scope="module")
def ondisk(tmp_path_factory) -> Path:
    out = vectors_index(tmp_path_factory.mktemp("ondisk"), "ondisk", "IVF16,Flat", "--index-memory", "1M")
    assert (out / "versions" / str(OutputDir(out).current_version()) / "index.ivfdata").is_file()
    return out


@pytest.mark.parametrize("keep", [0, 0.5, 0.99])
def test_ondisk_list_data_shorter_than_its_lists_is_65_not_a_sigbus(ondisk, tmp_path, keep):
    """FAISS maps the list data's size as index.faiss records it: a shorter index.ivfdata under a manifest that
    vouches for it (re-signed) made the first search a SIGBUS (exit -7 / 135). Now the open compares the sizes."""
    out, version = copy_index(ondisk, tmp_path)
    data = version / "index.ivfdata"
    os.truncate(data, int(data.stat().st_size * keep))
    resign(version, sha256=True)
    query = np.ones((1, 64), np.float32)
    np.save(tmp_path / "q.npy", query)
    refused(petal("query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "5"), 65, "index.ivfdata")
    refused(api(out), 65, "index.ivfdata")
    refused(api(out, "lang = 'en'"), 65, "index.ivfdata")


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> Path:
    """sample_data as a binary index (rescore.npy: 348 x 384 float16), embedded by the fake engine."""
    root = tmp_path_factory.mktemp("binary")
    model = make_fake_model_dir(root / "model", dim=384)
    out = root / "out"
    proc = petal("index", str(SAMPLE_DATA), "--out", str(out), "-q", "--quantize", "binary", "--model", str(model),
                 env={"PETAL_TEST_FAKE_ENGINE": str(root / "fake.jsonl")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _flip(path: Path, offset: int) -> None:
    blob = bytearray(path.read_bytes())
    blob[offset] ^= 0xFF
    path.write_bytes(bytes(blob))


def _reshaped(path: Path, rows: int, dim: int, dtype: str = "float16") -> None:
    path.unlink()
    np.save(path, np.zeros((rows, dim), dtype))


RESCORE_DAMAGE = {
    "empty": lambda p, n, d: p.write_bytes(b""),
    "header byte": lambda p, n, d: _flip(p, 10),  # inside the header's dict: Python's tokenizer fails
    "magic": lambda p, n, d: _flip(p, 0),
    "header dtype": lambda p, n, d: p.write_bytes(p.read_bytes().replace(b"'<f2'", b"'|O8'", 1)),
    "fewer rows": lambda p, n, d: _reshaped(p, n - 1, d),
    "other dim": lambda p, n, d: _reshaped(p, n, d // 2),
    "one dimension": lambda p, n, d: (p.unlink(), np.save(p, np.zeros(n * d, np.float16))),
    "integers": lambda p, n, d: _reshaped(p, n, d, "int16"),
}


@pytest.mark.parametrize("damage", list(RESCORE_DAMAGE))
@pytest.mark.parametrize("sha256", [True, False], ids=["re-signed", "body-only"])
def test_a_damaged_rescore_npy_is_65_naming_it(binary, tmp_path, damage, sha256):
    """rescore.npy's header goes through numpy's parser (Python's tokenizer and ast): a damaged one was an
    EOFError ('Aborted!', exit 1) or a tokenize.TokenError traceback, and a file of another shape an IndexError
    or a wrong answer at search time. Now 65 naming the file, from petal query and the Python API; petal verify
    finds the change whenever the sha256 was left as written."""
    out, version = copy_index(binary, tmp_path)
    path = version / "rescore.npy"
    rows, dim = np.load(path, mmap_mode="r").shape
    RESCORE_DAMAGE[damage](path, rows, dim)
    resign(version, sha256=sha256)
    np.save(tmp_path / "q.npy", np.ones((1, dim), np.float32))
    refused(petal("query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "3"), 65, "rescore.npy")
    refused(api(out), 65, "rescore.npy")
    if not sha256:
        refused(petal("verify", str(out)), 65, "rescore.npy")


@pytest.fixture(scope="module")
def unfilterable(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("unfilterable")
    # NOTE: 400 vectors: enough to train PQ8's and RQ4x8's 256 centroids (IVF16,RQ4x8 trained 2,000 for ~20 s);
    # the five petal index runs need nothing of each other: side by side
    factories = ("PQ8", "LSH", "NSG16", "PQ8x4fs", "IVF16,RQ4x8")
    with ThreadPoolExecutor(len(factories)) as pool:
        built = {factory: pool.submit(vectors_index, root, factory.replace(",", "_"), factory, "--metric", "l2",
                                      rows=400, dim=32) for factory in factories}
        return {factory: future.result() for factory, future in built.items()}


@pytest.mark.parametrize("factory", ["PQ8", "LSH", "NSG16", "PQ8x4fs", "IVF16,RQ4x8"])
def test_where_on_an_index_type_that_cannot_filter_is_a_usage_error(unfilterable, tmp_path, factory):
    """FAISS refuses a selector in these index types' searches: petal query --where and the API's
    search(where=) ended in a RuntimeError traceback (exit 1). Now a usage error (2) naming the factory."""
    out = unfilterable[factory]
    np.save(tmp_path / "q.npy", np.ones((1, 32), np.float32))
    refused(petal("query", str(out), "--vector-file", str(tmp_path / "q.npy"), "--where", "lang = 'en'"), 2,
            "--where", "cannot filter", factory)
    refused(api(out, "lang = 'en'"), 2, "cannot filter")
    assert petal("query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "2").returncode == 0


@pytest.mark.parametrize("factory", ["Flat", "HNSW32", "IVF4,Flat"])
def test_verify_of_a_binary_index_under_a_float_factory_is_65(binary, tmp_path, factory):
    """A binary index whose manifest (signed again) names a float factory: petal verify ended in a traceback (exit 1:
    FAISS's binary writer refused the float index the factory made), --json printed nothing."""
    out, version = copy_index(binary, tmp_path)
    with signed_manifest(version) as manifest:
        manifest["index"]["factory"] = factory
    for argv in (["verify", out], ["verify", out, "--json"]):
        proc = petal(*map(str, argv))
        assert proc.returncode == 65, (argv, proc.stderr[-2000:])
        assert f'the manifest\'s index.factory "{factory}" makes' in proc.stderr + proc.stdout, proc.stderr[-2000:]
