"""``petal serve``'s number flags take numbers: NaN (click's FloatRange lets it through: it fails no comparison) is a
usage error (2) naming the flag, before the port opens, and ``--max-wait-ms`` is at most 60000 (a minute). Before:
``--drain-timeout-s nan`` exited 1 with a traceback at the stop, ``--header-timeout-s nan`` answered every request 400,
``--keep-alive-s nan`` hung every connection, ``--body-timeout-s nan`` answered 500, ``--switch-interval-ms nan``
aborted the process (a fatal error in the GIL), and ``--max-wait-ms inf`` (or 1e308) killed the engine thread at the
first request (OverflowError in its wait): every request hung unanswered while ``/ready`` said ready.

Real components: ``petal serve`` in child processes over sample_data indexed with the packaged MiniLM
(``tests/_serve_shared.sample_out``)."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests._serve_shared import sample_out

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

NUMBER_FLAGS = ("--max-wait-ms", "--reload-interval-s", "--drain-timeout-s", "--header-timeout-s", "--keep-alive-s",
                "--body-timeout-s", "--send-timeout-s", "--switch-interval-ms", "--engine-spin-ms")


def _serve(out, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PETAL_API_KEY"}
    return subprocess.run([sys.executable, "-m", "petal.cli.main", "serve", str(out), "--port", "0", *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_nan_and_a_wait_past_a_minute_are_usage_errors_naming_the_flag(tmp_path_factory):
    out = sample_out(tmp_path_factory)
    cases = [(flag, "nan", f"{flag} nan is not a number") for flag in NUMBER_FLAGS]
    cases += [("--max-wait-ms", value, "'--max-wait-ms'") for value in ("inf", "1e308", "60001")]
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda case: _serve(out, case[0], case[1]), cases))
    for (flag, value, said), proc in zip(cases, done):
        assert proc.returncode == 2, (flag, value, proc.returncode, proc.stderr[-2000:])
        assert "answers now" not in proc.stderr and "Traceback" not in proc.stderr, (flag, value, proc.stderr)
        assert said in proc.stderr, (flag, value, proc.stderr)
