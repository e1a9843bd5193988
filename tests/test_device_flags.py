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
