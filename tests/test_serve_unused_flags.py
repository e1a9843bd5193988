"""``petal serve`` flags that would set a part the server does not have are usage errors (exit 2) naming them, before
the port opens; they were silently ignored.

- An index of precomputed vectors (``petal index --vectors-column``) served without ``--model``: no model is loaded,
  so the model and engine flags (``--max-tokens-per-text``, ``--token-budget``, ``--max-seqs``, ``--max-wait-ms``,
  ``--engine-spin-ms``, ``--served-model-name``, ``--device``, ``--dtype``, ``--attention``, ``--query-prompt``,
  ``--allow-pickle-weights``) set nothing. With ``--model DIR`` they set that model.
- ``--model DIR`` alone (no OUT): no index, so the search and following flags set nothing.
- Only flags given count: a default is no request.
- ``--search-device cuda --device cpu`` said "needs the model on CUDA" on an index without a model. Now: a text
  index's GPU copy is searched with the model's query vectors, so it needs the model on CUDA (said so); an index of
  vectors without a model refuses ``--device`` (no model) and never mentions a model on CUDA; with ``--model`` its
  GPU copy needs CUDA only (the client's rows are searched, the model serves /v1/embeddings).

Real components: ``petal index`` over real Parquet, ``petal serve`` in child processes (loopback ports)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.test_serve import Server, cli_run
from tests.test_serve_vectors_only import make_data

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

MODEL_FLAGS = {"--max-tokens-per-text": "64", "--token-budget": "128", "--max-seqs": "4", "--max-wait-ms": "0",
               "--engine-spin-ms": "1", "--served-model-name": "mine", "--device": "cpu", "--dtype": "float32",
               "--attention": "torch", "--query-prompt": "query: ", "--allow-pickle-weights": None}
INDEX_FLAGS = {"--max-k": "5", "--nprobe": "2", "--rescore": "3", "--reload-interval-s": "2", "--threads": "2",
               "--search-device": "cpu", "--search-dtype": "float32", "--search-exact": None}


def _argv(flags: dict[str, str | None]) -> list[str]:
    return [part for flag, value in flags.items() for part in ([flag] if value is None else [flag, value])]


def serve(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", "serve", "--port", "0", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def refused(done: subprocess.CompletedProcess) -> str:
    """The usage error's line (exit 2, the port never opened)."""
    assert done.returncode == 2, done.stderr
    assert "answers now" not in done.stderr and "listening" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.fixture(scope="module")
def vectors_out(tmp_path_factory):
    root = tmp_path_factory.mktemp("unused-flags")
    data, _ = make_data(root)
    out = root / "out"
    cli_run("index", data, "--out", out, "-q", "--vectors-column", "emb", "--index-factory", "Flat")
    return out


def test_model_flags_without_a_model_are_refused(vectors_out):
    version = (vectors_out / "CURRENT").read_text().strip()
    line = refused(serve(vectors_out, *_argv(MODEL_FLAGS)))
    for flag in MODEL_FLAGS:
        assert flag in line, (flag, line)
    assert "the index has no model" in line and version in line and "precomputed vectors (emb" in line, line
    assert "--model DIR" in line and "these flags set nothing" in line, line
    for flag, value in MODEL_FLAGS.items():  # each one alone, at its default value too (given is given)
        if flag in ("--max-tokens-per-text", "--max-wait-ms", "--engine-spin-ms", "--allow-pickle-weights"):
            line = refused(serve(vectors_out, *_argv({flag: value})))
            assert line.startswith(f"Error: {flag}: the index has no model") and "this flag sets" in line, line


def test_flags_that_apply_and_defaults_still_start_a_server(vectors_out, tmp_path):
    """Flags every server uses (limits, queue, threads, GIL interval, search) are taken without a model."""
    server = Server(tmp_path / "server.log", vectors_out, "--max-texts", "4", "--max-queue-texts", "16",
                    "--switch-interval-ms", "1", "--threads", "2", "--max-k", "7", "--search-device", "cpu",
                    "--reload-interval-s", "0.5", "--max-body-bytes", "65536", "--drain-timeout-s", "5")
    try:
        ready = server.client.get("/ready").json()
        assert ready["model"] is None and ready["search"] == {"device": "cpu", "copy": None}
        too_many = server.client.post("/search", json={"vectors": [[0.0] * 16], "k": 8})
        assert too_many.status_code == 422 and "--max-k" in too_many.text
    finally:
        server.stop()


def test_with_model_dir_the_model_flags_set_that_model(vectors_out, tmp_path, minilm_dir):
    server = Server(tmp_path / "server.log", vectors_out, "--model", minilm_dir, "--device", "cpu",
                    "--served-model-name", "mine", "--max-tokens-per-text", "8", "--max-seqs", "4")
    try:
        assert server.client.get("/ready").json()["model"] == "mine"
        assert [m["id"] for m in server.client.get("/v1/models").json()["data"]] == ["mine"]
        long = server.client.post("/v1/embeddings", json={"input": "one two three four five six seven eight nine"})
        assert long.status_code == 413 and "--max-tokens-per-text" in long.text, long.text
    finally:
        server.stop()


def test_index_flags_without_an_index_are_refused(minilm_dir):
    line = refused(serve("--model", minilm_dir, *_argv(INDEX_FLAGS)))
    for flag in INDEX_FLAGS:
        assert flag in line, (flag, line)
    assert "no index is served" in line and "give OUT" in line, line


def test_search_device_cuda_with_device_cpu_on_an_index_without_a_model(vectors_out):
    """The error names --device (no model to place) and never says a model is needed on CUDA."""
    line = refused(serve(vectors_out, "--device", "cpu", "--search-device", "cuda"))
    assert line.startswith("Error: --device: the index has no model"), line
    assert "model on CUDA" not in line and "--search-device cuda alone searches a GPU copy" in line, line


def test_search_device_cuda_with_a_model_on_the_cpu_beside_an_index_of_vectors(vectors_out, tmp_path, minilm_dir):
    """With --model DIR on the CPU (/v1/embeddings), the index of vectors' GPU copy needs CUDA only."""
    args = (vectors_out, "--model", minilm_dir, "--device", "cpu", "--search-device", "cuda")
    if not _cuda():
        line = refused(serve(*args))
        assert "CUDA device for the GPU copy" in line and "model on CUDA" not in line, line
        return
    server = Server(tmp_path / "server.log", *args)
    try:
        ready = server.client.get("/ready").json()
        assert ready["device"] == "cpu" and ready["search"]["device"].startswith("cuda"), ready
    finally:
        server.stop()
