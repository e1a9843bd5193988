"""A stderr that refuses every write (``2>/dev/full``; a full disk under cron's ``2>>LOG``) is no failure of the
command: stderr holds diagnostics (progress, notes, the summary line, an error's message), never the output asked
for. The command's own exit code stands: 0 when the work is done and its output written, the error's code when it
failed (here 66 for a missing --input), 74 when its output (stdout) could not be written; never 1 (a bug's code)
and never a traceback. Was: 1 for each, the summary line's failed write being taken for an error whose message
failed too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO


def petal(args: list[str], cwd: Path, stdout=subprocess.DEVNULL) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, "-m", "petal.cli.main", *args], cwd=cwd, env=env, stdout=stdout,
                              stderr=full, timeout=600).returncode


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    work = tmp_path_factory.mktemp("stderr-full")
    assert petal(["index", str(REPO / "sample_data"), "--out", "idx", "--model", str(minilm_dir)], work) == 0
    assert (work / "idx" / "CURRENT").is_file()
    return work


def test_embed_with_stderr_full_is_0_and_its_output_written(tmp_path, minilm_dir):
    (tmp_path / "t.txt").write_text("glaciers\nbread\n")
    assert petal(["embed", "--input", "t.txt", "--output", "out.npy"], tmp_path) == 0
    assert np.load(tmp_path / "out.npy").shape == (2, 384)
    with open(tmp_path / "out.jsonl", "w") as out:
        assert petal(["embed", "glaciers"], tmp_path, stdout=out) == 0
    assert len(json.loads((tmp_path / "out.jsonl").read_text())["embedding"]) == 384


@pytest.mark.parametrize("args", [["query", "idx", "how do glaciers move"], ["query", "idx", "glaciers", "--json"],
                                  ["info", "idx"], ["info", "idx", "--json"], ["verify", "idx"],
                                  ["rebuild", "idx", "--json"]], ids=" ".join)
def test_other_commands_with_stderr_full_are_0(built, args):
    assert petal(args, built) == 0


def test_a_failing_command_keeps_its_code_and_a_failing_stdout_is_74(built):
    assert petal(["embed", "--input", "missing.txt"], built) == 66
    with open("/dev/full", "w") as full:
        assert petal(["query", "idx", "glaciers"], built, stdout=full) == 74
