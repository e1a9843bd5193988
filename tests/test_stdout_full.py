"""A stdout that cannot be written (``> FILE`` on a full disk: ``/dev/full``) ends ``petal query`` (one-shot and
``--stdin``) and ``petal embed`` with 74 naming stdout; it was "I/O error on a file", which names nothing a user
can look for. Real processes, real tiny BERT, real FAISS."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")


@pytest.fixture(scope="module")
def small_index(tmp_path_factory, tiny_bert_dir):
    root = tmp_path_factory.mktemp("full")
    pq.write_table(pa.table({"id": list(range(4)), "text": [f"document {i}" for i in range(4)]}), root / "d.parquet")
    result = CliRunner().invoke(cli, ["index", str(root / "d.parquet"), "--out", str(root / "out"), "--model",
                                      str(tiny_bert_dir), "-q"])
    assert result.exit_code == 0, result.output
    return root / "out"


@pytest.mark.parametrize("command", ["query", "query --stdin", "embed", "info", "info --json", "verify",
                                     "verify --json"])
def test_a_full_stdout_is_74_naming_stdout(small_index, tiny_bert_dir, command):
    """(petal info and petal verify, text and --json, said "I/O error on a file" too.)"""
    args = {"query": ["query", str(small_index), "document", "--json"],
            "query --stdin": ["query", str(small_index), "--stdin"],
            "embed": ["embed", "document", "--model", str(tiny_bert_dir)],
            "info": ["info", str(small_index)], "info --json": ["info", str(small_index), "--json"],
            "verify": ["verify", str(small_index)], "verify --json": ["verify", str(small_index), "--json"]}[command]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PETAL_")}
    with open("/dev/full", "wb") as full:
        result = subprocess.run([sys.executable, "-m", "petal.cli.main", *args], input=b"document\n", stdout=full,
                                stderr=subprocess.PIPE, cwd=REPO, env=env, timeout=300)
    err = result.stderr.decode()
    assert result.returncode == 74, err
    assert "stdout" in err and "No space left on device" in err and "Traceback" not in err, err


@pytest.mark.parametrize("command", ["info", "verify"])
def test_a_json_failure_object_stdout_cannot_take_keeps_the_failure(tmp_path, command):
    """``--json`` on a path that holds no index, stdout full: the failure's own message and exit code (78) on
    stderr, and the object that could not be written said there; it was 74 'I/O error on a file' alone, the
    reason (not an index) lost."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PETAL_")}
    with open("/dev/full", "wb") as full:
        result = subprocess.run([sys.executable, "-m", "petal.cli.main", command, str(tmp_path / "none"), "--json"],
                                stdout=full, stderr=subprocess.PIPE, cwd=REPO, env=env, timeout=300)
    err = result.stderr.decode()
    assert result.returncode == 78, err
    assert "is not a petal index" in err and "stdout" in err and "Traceback" not in err, err
