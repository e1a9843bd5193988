"""A script that calls ``petal.index(..., workers=N)`` at its top level, without ``if __name__ == "__main__":``.

Python's spawn runs the script again in every worker as it starts: the worker's own call met the parent's writer
lock (or multiprocessing's "bootstrapping phase" RuntimeError) and died before "ready", printing a traceback whatever
``quiet`` asked, and the run ended 75 ("worker 1 ... died (exit 1); rerun ..."): a retry for cron or Airflow of a
mistake that fails the same way every time. Now the worker ends at once and quietly, and the run is a usage error
(2) naming the script and the guard (README: Limits of the scale-out). Real script files in their own interpreter,
real spawned workers, the logging fake engine (tests/fake_engine.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

CALL = """petal.index(sys.argv[1], sys.argv[2], engine_factory=fake_engine_factory(None), {scale}, quiet=True,
                json_report=sys.argv[2] + ".json")"""
SCRIPT = """import sys
import petal
from tests.fake_engine import fake_engine_factory

print("top level", flush=True)
def main() -> None:
    try:
        report = {call}
    except petal.PetalError as exc:
        print(f"{{type(exc).__name__}} {{exc.exit_code}}: {{exc}}", flush=True)
        sys.exit(exc.exit_code)
    print(f"{{report.status}} {{report.rows['embedded']}}", flush=True)
{main}"""


def run_script(tmp_path: Path, scale: str, guarded: bool) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "make_index.py"
    call = CALL.format(scale=scale)
    script.write_text(SCRIPT.format(call=call, main='if __name__ == "__main__":\n    main()\n' if guarded
                                    else "main()\n"))
    return subprocess.run([sys.executable, str(script), str(REPO / "sample_data"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("scale", ["workers=2", "workers=1"])
def test_an_unguarded_script_is_a_usage_error_naming_the_guard_and_its_workers_print_nothing(tmp_path, scale):
    done = run_script(tmp_path, scale, guarded=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr == "", done.stderr  # was each worker's traceback (multiprocessing's, or the lock's 75)
    last = done.stdout.splitlines()[-1]
    assert last.startswith("UsageError 2: workers/devices start worker processes with Python's spawn, which runs "
                           f"{tmp_path / 'make_index.py'} again"), done.stdout
    assert 'keep the script\'s top level under `if __name__ == "__main__":`' in last, last
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["exit_code"] == 2 and report["status"] == "failed" and "__main__" in report["message"]


def test_the_guarded_script_embeds_with_its_workers(tmp_path):
    done = run_script(tmp_path, "workers=2", guarded=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "success 342", done.stdout
    assert done.stderr == "", done.stderr
