"""``python -m petal`` runs the ``petal`` command (pyproject's console script ``petal = petal.cli.main:main``): it was
"No module named petal.__main__; 'petal' is a package and cannot be directly executed" (exit 1), so an environment
without its scripts directory on ``PATH`` had no way to run petal but ``python -m petal.cli.main``."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO


def python_m(*args: str, cwd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL)


def test_python_m_petal_is_the_petal_command(tmp_path):
    assert 'petal = "petal.cli.main:main"' in (REPO / "pyproject.toml").read_text()  # what `python -m petal` runs
    version = python_m("petal", "--version", cwd=str(tmp_path))
    assert (version.returncode, version.stdout, version.stderr) == (0, "petal, version 0.1.0\n", "")
    usage = python_m("petal", "--help", cwd=str(tmp_path))
    assert usage.returncode == 0 and usage.stdout.startswith("Usage: python -m petal [OPTIONS] COMMAND"), usage
    # a command runs, with the command's exit code and one line of error, as `python -m petal.cli.main` (the script)
    missing = str(tmp_path / "missing")
    ran, script_ran = python_m("petal", "info", missing, cwd=str(tmp_path)), \
        python_m("petal.cli.main", "info", missing, cwd=str(tmp_path))
    assert (ran.returncode, ran.stdout, ran.stderr) == (script_ran.returncode, script_ran.stdout, script_ran.stderr)
    assert ran.returncode == 78 and ran.stderr.startswith("petal: error: ") and len(ran.stderr.splitlines()) == 1
