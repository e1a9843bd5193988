"""SIGINT (Ctrl-C) to a command that no run's own signal handling covers (``petal query --stdin`` waiting for a
line, ``petal embed --stdin`` reading its input, a model loading) ends it with the contract's 130 and one line on
stderr, never click's "Aborted!" with exit 1 (the code of a bug); a --stdin that is closed (``<&-``) is no input
(66). Real processes, real tiny BERT, real FAISS."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests.conftest import REPO
from tests.pipes import Pipes


@pytest.fixture(scope="module")
def small_index(tmp_path_factory, tiny_bert_dir):
    root = tmp_path_factory.mktemp("sigint")
    pq.write_table(pa.table({"id": list(range(6)), "text": [f"document {i} about glaciers" for i in range(6)]}),
                   root / "docs.parquet")
    result = CliRunner().invoke(cli, ["index", str(root / "docs.parquet"), "--out", str(root / "out"), "--model",
                                      str(tiny_bert_dir), "-q"])
    assert result.exit_code == 0, result.output
    return root / "out", tiny_bert_dir


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # NOTE: a test runner started in the background ignores SIGINT


@pytest.mark.parametrize("command", ["query", "embed"])
def test_sigint_while_reading_stdin_is_130_without_a_traceback(small_index, command):
    index, model = small_index
    args = {"query": ["query", str(index), "--stdin", "--json", "-k", "1"],
            "embed": ["embed", "--stdin", "--model", str(model)]}[command]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PETAL_")}
    child = subprocess.Popen([sys.executable, "-m", "petal.cli.main", *args], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env,
                             preexec_fn=_default_sigint)
    with Pipes(child) as pipes:
        assert child.stdin is not None
        child.stdin.write(b"glaciers\n")
        child.stdin.flush()
        if command == "query":
            assert b'"hits"' in pipes.line("the answer to 'glaciers'")  # answered: it waits for the next line
        else:
            time.sleep(3)  # started and blocked reading stdin (no EOF yet)
        child.send_signal(signal.SIGINT)
        code, _, err = pipes.finish(60)
    assert code == 130, err.decode()
    assert b"Traceback" not in err and b"Aborted!" not in err, err.decode()
    assert err.decode().strip().splitlines()[-1] == "petal: interrupted by SIGINT"


def _closed_stdin() -> None:
    os.close(0)  # `<&-`: Python starts with sys.stdin None


@pytest.mark.parametrize("command", ["query", "embed"])
def test_a_closed_stdin_is_no_input(small_index, command):
    """--stdin with fd 0 closed was an AttributeError traceback (exit 1: 'NoneType' object has no attribute
    'buffer')."""
    index, model = small_index
    args = {"query": ["query", str(index), "--stdin"], "embed": ["embed", "--stdin", "--model", str(model)]}[command]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PETAL_")}
    result = subprocess.run([sys.executable, "-m", "petal.cli.main", *args], capture_output=True, cwd=REPO, env=env,
                            timeout=300, preexec_fn=_closed_stdin)
    err = result.stderr.decode()
    assert result.returncode == 66 and "stdin is closed" in err and "Traceback" not in err, err
