"""What ``petal rebuild``, ``info``, ``verify`` and ``query`` exit with for an OUT (INDEX) that holds no index, as
README's exit codes say, one code for all four: missing, a regular file, an empty directory are 78 (no index there:
configuration, not a missing input file); one petal may not read is 66 for the readers and 73 for ``petal rebuild``,
which writes it (run in a user namespace as a user without root's override, so the permission is real)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

COMMANDS = [["rebuild"], ["info"], ["verify"], ["query", "--", "{}", "glaciers"]]


def petal(args: list[str], cwd: Path, as_user: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    prefix = ["unshare", "--user", "--map-user=1000", "--map-group=1000"] if as_user else []
    return subprocess.run([*prefix, sys.executable, "-m", "petal.cli.main", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def command(words: list[str], path: str) -> list[str]:
    return [w.format(path) for w in words] if "{}" in words else [*words, path]


@pytest.mark.parametrize("words", COMMANDS, ids=lambda w: w[0])
@pytest.mark.parametrize("kind", ["missing", "a regular file", "an empty directory"])
def test_an_out_that_holds_no_index_is_78(tmp_path, words, kind):
    path = tmp_path / "out"
    if kind == "a regular file":
        path.write_text("x\n")
    elif kind == "an empty directory":
        path.mkdir()
    proc = petal(command(words, str(path)), tmp_path)
    assert proc.returncode == 78, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and str(path) in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root's user namespaces")
@pytest.mark.parametrize(("words", "code"), [(COMMANDS[0], 73), *((w, 66) for w in COMMANDS[1:])],
                         ids=lambda v: v[0] if isinstance(v, list) else str(v))
def test_an_out_petal_may_not_read_is_66_or_73_for_rebuild(tmp_path, words, code):
    locked = tmp_path / "locked"
    (locked / "out").mkdir(parents=True)
    locked.chmod(0)
    try:
        proc = petal(command(words, str(locked / "out")), tmp_path, as_user=True)
    finally:
        locked.chmod(0o755)
    if "unshare:" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
