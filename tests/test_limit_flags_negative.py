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


@pytest.mark.parametrize("flag", ["--max-removed", "--max-bad-rows"])
@pytest.mark.parametrize("value", ["", " ", "%", "lots", "x%"])
def test_a_limit_that_is_no_number_says_what_the_flag_takes(tmp_path, flag, value):
    """Before: Python's own words, "could not convert string to float: ''"."""
    argv = [PETAL, "index", str(tmp_path / "missing"), "--out", str(tmp_path / "out"), f"{flag}={value}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"{flag} {value!r}: expected a count (100) or a fraction" in done.stderr, done.stderr
    assert "could not convert" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("flag", ["--max-removed", "--max-bad-rows"])
def test_a_limit_of_thousands_of_digits_is_refused_and_cut_in_the_message(tmp_path, flag):
    """A count over 2**63 - 1 is refused (was taken: 10**30); 5000 digits were echoed whole, twice, after Python's
    "Exceeds the limit (4300 digits) for integer string conversion"."""
    for value in ("9" * 5000, "9" * 19, "1" + "0" * 30):
        argv = [PETAL, "index", str(tmp_path / "missing"), "--out", str(tmp_path / "out"), f"{flag}={value}"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "over the largest, 2**63 - 1" in done.stderr and "4300" not in done.stderr, done.stderr[-2000:]
        assert len(done.stderr) < 600, done.stderr[-2000:]


@pytest.mark.parametrize("argv", [["index", "{missing}", "--out", "{out}", "--max-length", "{n}"],
                                  ["index", "{missing}", "--out", "{out}", "--max-seqs", "{n}"],
                                  ["index", "{missing}", "--out", "{out}", "--keep-versions", "-{n}"],
                                  ["query", "{missing}", "x", "-k", "{n}"],
                                  ["bench", "index", "--vectors", "{n}"]])
def test_a_number_flag_of_thousands_of_digits_is_cut_in_the_message(tmp_path, argv):
    """click's int types ("'999...' is not a valid integer" past Python's 4300 digits) and petal's own checks of a
    number echoed a 4000- or 5000-digit value whole; each is cut to 40 digits with its length, exit 2."""
    digits = "9" * 4000
    args = [a.format(missing=tmp_path / "missing", out=tmp_path / "out", n=digits) for a in argv]
    done = subprocess.run([PETAL, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "9" * 39 + "..." in done.stderr and len(done.stderr) < 1000, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
