"""``--dtype``/``--attention`` the engine refuses on the device it runs on: a usage error (2) naming the flag, in
every command. With ``--device cpu`` the flags alone decide it (tests/test_lazy_imports.py: before torch loads);
with ``--device auto`` on a machine without CUDA it is known once torch says so: ``petal serve`` loads its model in a
thread, where the engine's refusal ended in a traceback and exit 1."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--dtype", "float16", "--dtype float16 is not supported on the CPU"),
    ("--attention", "flashinfer", "--attention flashinfer needs CUDA")])
@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_serve_refuses_what_the_cpu_engine_cannot_run_as_a_usage_error(minilm_dir, flag, value, said, device):
    torch = pytest.importorskip("torch")
    if device == "auto" and torch.cuda.is_available():
        pytest.skip("auto runs on CUDA here")
    argv = [sys.executable, "-m", "petal.cli.main", "serve", "--model", str(minilm_dir), "--port", "0", "--device",
            device, flag, value]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize(("setting", "said"), [({"dtype": "float16"}, "dtype float16 is not supported on the CPU"),
                                               ({"attention": "flashinfer"}, "attention flashinfer needs CUDA")])
def test_the_api_refuses_them_on_the_cpu_before_torch_loads(setting, said, minilm_dir):
    """``petal.Embedder(device="cpu", dtype="float16")``: the same refusal, before torch is imported (it was imported,
    ~2 s, only to refuse)."""
    code = (f"import sys, petal\ntry:\n    petal.Embedder(device='cpu', **{setting!r})\nexcept petal.UsageError as e:\n"
            "    print(e)\nprint('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    said_lines = done.stdout.splitlines()
    assert done.returncode == 0 and said in said_lines[0] and said_lines[-1] == "False", done.stdout + done.stderr


@pytest.mark.parametrize("command", ["embed", "index"])
def test_an_attention_mask_the_model_lacks_is_a_usage_error(minilm_dir, tmp_path, command):
    """``--attention-mask causal`` of a BERT model (bidirectional only) is a flag value the run judges against the
    model, as ``--device cuda`` without CUDA: 2 naming the flag (was 78, a configuration error of the model)."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": ["a"], "text": ["one text"]}), data / "a.parquet")
    where = ["hi"] if command == "embed" else [str(data), "--out", str(tmp_path / "out"), "-q"]
    argv = [sys.executable, "-m", "petal.cli.main", command, *where, "--model", str(minilm_dir), "--device", "cpu",
            "--attention-mask", "causal"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "--attention-mask causal: bert models are bidirectional only" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr


def test_the_api_raises_it_as_a_usage_error(minilm_dir):
    """``petal.Embedder(attention_mask="causal")`` of a BERT model: ``petal.UsageError`` naming the keyword, as the
    API's other flag-judged values."""
    code = (f"import petal\ntry:\n    petal.Embedder({str(minilm_dir)!r}, device='cpu', attention_mask='causal')\n"
            "except petal.UsageError as e:\n    print(e.exit_code, e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("2 attention_mask causal: bert"), done.stdout + done.stderr
