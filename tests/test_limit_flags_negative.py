"""A negative ``--max-removed`` or ``--max-bad-rows`` is a usage error (2) that says so. Before, ``-1`` was read as a
fraction: "--max-removed fraction -1.0 is not between 0 and 1". Real ``petal index`` processes (refused while the
flags are parsed, before any source is read)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PETAL = str(Path(sys.executable).parent / "petal")


@pytest.mark.parametrize("flag", ["--max-removed", "--max-bad-rows"])
@pytest.mark.parametrize("value", ["-1", "-5%", "-0.5", " -3"])
def test_a_negative_limit_says_it_is_negative(tmp_path, flag, value):
    argv = [PETAL, "index", str(tmp_path / "missing"), "--out", str(tmp_path / "out"), f"{flag}={value}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"{flag} {value!r}: expected a count (100) or a fraction" in done.stderr and "never negative" in done.stderr
    assert "not between 0 and 1" not in done.stderr and "Traceback" not in done.stderr
