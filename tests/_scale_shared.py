"""Shared by the scale-out tests (test_scale_workers, test_scale_ranges, test_ranges_full, test_worker_orphan):
``petal index --workers N`` coordinators in real processes that start in milliseconds.

A coordinator is petal's CLI with the tests' fake engine seam (``tests.fake_cli``, as ``python -m tests.fake_cli``
runs it), forked from tests/forkrun.py's preloaded forkserver instead of a fresh interpreter that spends seconds
importing torch, faiss and pyarrow: a real process all the same (its own pid, real SIGKILL and SIGTERM, its own
exit status, stderr in a file its workers inherit). Unlike forkrun's children it is not daemonic, since a daemonic
multiprocessing child may not have children and petal refuses to start workers there. Its workers are what
petal makes them: fresh interpreters (multiprocessing's spawn) that import the engine themselves.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from tests import forkrun
from tests.conftest import REPO


def worker_processes(pid: int) -> list[int]:
    """The worker processes of coordinator ``pid`` now (its spawned children, not its resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has ended: its new parent reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Coordinator:
    """``petal ARGV`` (the fake engine seam) in a process forked from the preloaded forkserver, not daemonic."""

    def __init__(self, argv: list[str], env: dict[str, str | None], stderr: Path | None = None) -> None:
        """``stderr``: the file its stderr (and its workers') goes to, kept (else a temporary file ``wait`` removes)."""
        self.out = tempfile.mkstemp(prefix="petal-out-")[1]
        self.keep_err = stderr is not None
        if stderr is not None:
            stderr.touch()
        self.err = str(stderr) if stderr is not None else tempfile.mkstemp(prefix="petal-err-")[1]
        # NOTE: PYTHONPATH: the spawned workers import tests.fake_engine (the pickled engine factory)
        self.process = forkrun._context().Process(
            target=forkrun._child, args=([str(a) for a in argv], {"PYTHONPATH": str(REPO), **env}, self.out, self.err),
            daemon=False)
        self.process.start()
        self.pid = int(self.process.pid)

    def send_signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL, unless it has ended."""
        if self.process.exitcode is None:
            self.process.kill()

    def poll(self) -> int | None:
        """The exit status (-N when killed by signal N), or None while it runs."""
        return self.process.exitcode

    def stderr(self) -> str:
        return Path(self.err).read_text(errors="replace")

    def workers_until_exit(self, timeout: float = 240) -> list[int]:
        """Every worker process seen while it runs (polled), until it exits or ``timeout`` passes."""
        seen: set[int] = set()
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            seen.update(worker_processes(self.pid))
            time.sleep(0.05)
        return sorted(seen)

    def wait(self, timeout: float = 240) -> tuple[int, str]:
        """``(exit status, stderr)``; the process is killed (and the test fails) when it outlives ``timeout``."""
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
            raise TimeoutError(f"petal did not finish in {timeout} s: {self.stderr()[-2000:]}")
        stderr = self.stderr()
        os.unlink(self.out)
        if not self.keep_err:
            os.unlink(self.err)
        return int(self.process.exitcode), stderr


class Petal(Coordinator):
    """``petal ARGV --json-report REPORT`` with the fake engine seam; ``wait()`` -> (exit status, stderr, report)."""

    def __init__(self, argv: list[str], env: dict[str, str], report: Path) -> None:
        self.report = report
        super().__init__([*argv, "--json-report", str(report)], dict(env))

    def wait(self, timeout: float = 240) -> tuple[int, str, dict[str, Any]]:  # type: ignore[override]
        rc, stderr = super().wait(timeout)
        return rc, stderr, json.loads(self.report.read_text())


def commit_part(store: Any, info: Any, first_group: int, stop_group: int, group_rows: int = 10) -> None:
    """Commit row groups ``[first_group, stop_group)`` of shard ``info`` (``group_rows`` rows each, ids
    ``big-<row>``) to ``store`` as a range part of 4-d vectors, as a worker's range commits."""
    import numpy as np

    from petal.pipeline.store.ranges import RowRange

    part = RowRange(0, first_group, stop_group, first_group * group_rows, (stop_group - first_group) * group_rows)
    writer = store.writer(info, "fp", {}, 4, part)
    rows = list(range(part.first_row, part.stop_row))
    writer.add(rows, [f"big-{r}" for r in rows], np.ones((len(rows), 4), np.float32))
    writer.input_done = True
    writer.commit()
