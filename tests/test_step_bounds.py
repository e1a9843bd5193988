"""``--token-budget`` and ``--max-seqs`` size the engine's buffers and graphs when it is built. They had no upper
bound: ``petal index --max-seqs 10**23`` ended in an OverflowError traceback (exit 1), ``--max-seqs 2**40`` in an
allocation failure, after the model loaded and with the output directory created; ``petal serve`` bound its port
first. Now a usage error (2) naming the flag and its range, before anything loads or is written, in every command and
in the Python API. Real ``petal`` processes and the real packaged model directory (never loaded here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import petal
from petal.engine.config import MAX_SEQS, MAX_TOKEN_BUDGET

PETAL = str(Path(sys.executable).parent / "petal")
SAMPLE = Path(__file__).resolve().parent.parent / "sample_data"
HUGE = str(10**23)


@pytest.mark.parametrize(("flag", "value", "shown"), [
    ("--max-seqs", HUGE, f"1..{MAX_SEQS}"), ("--max-seqs", str(1 << 40), f"1..{MAX_SEQS}"),
    ("--max-seqs", str(MAX_SEQS + 1), f"1..{MAX_SEQS}"), ("--token-budget", HUGE, f"2..{MAX_TOKEN_BUDGET}"),
    ("--token-budget", str(MAX_TOKEN_BUDGET + 1), f"2..{MAX_TOKEN_BUDGET}")])
def test_petal_index_refuses_a_step_too_large_before_any_work(tmp_path, flag, value, shown):
    out = tmp_path / "out"
    done = subprocess.run([PETAL, "index", str(SAMPLE), "--out", str(out), flag, value, "--device", "cpu"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"{flag} {value} is not in {shown}" in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()  # nothing created, no lock taken


@pytest.mark.parametrize(("flag", "value"), [("--max-seqs", HUGE), ("--max-seqs", str(MAX_SEQS + 1)),
                                             ("--token-budget", str(MAX_TOKEN_BUDGET + 1))])
def test_petal_serve_refuses_a_step_too_large_before_it_binds(tmp_path, flag, value):
    done = subprocess.run([PETAL, "serve", "--model", "minilm", "--port", "1", flag, value],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"Invalid value for '{flag}'" in done.stderr and "Traceback" not in done.stderr
    assert "answers now" not in done.stderr  # refused while the flags are parsed, before the bind


def test_the_api_refuses_a_step_too_large_when_built():
    with pytest.raises(petal.UsageError, match=rf"max_seqs {10**20} is not in 1\.\.{MAX_SEQS}"):
        petal.Embedder(device="cpu", max_seqs=10**20)
    with pytest.raises(petal.UsageError, match=rf"token_budget {MAX_TOKEN_BUDGET * 2} is not in 2\.\."):
        petal.Embedder(device="cpu", token_budget=MAX_TOKEN_BUDGET * 2)
