"""Run the petal CLI in real child processes, forked from one preloaded interpreter.

A fresh ``python -m tests.fake_cli`` (petal's CLI with the tests' fake engine seam) spends seconds
importing torch, faiss and pyarrow, and the crash-point sweep runs about a hundred CLI processes.
Here each run forks from a ``multiprocessing`` forkserver that imported all of that once: a real
process (its own pid, real SIGKILL and SIGTERM, its own exit status, its flock released by the
kernel when it dies) that starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import multiprocessing.forkserver as forkserver
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# NOTE: imports only, no torch op (the forkserver forks with no intra-op thread pool). pandas: pyarrow imports it
# on the first pa.table(dict) (each run that commits a store entry: 0.3-0.4 s a run); petal.engine: each run with
# petal's own engine
PRELOAD = ["petal.cli.main", "petal.cli.index", "petal.pipeline.jobs.index_run", "petal.pipeline.index.search",
           "petal.pipeline.api", "petal.pipeline.jobs.embed", "petal.engine.engine", "petal.engine.models.build",
           "petal.engine.models.bert", "tests.fake_engine", "tests.fake_cli", "faiss", "tokenizers", "pandas",
           "pyarrow.pandas_compat", "pyarrow.dataset"]
_CONTEXT: Any = None
REPO = Path(__file__).resolve().parents[1]


def _context() -> Any:
    global _CONTEXT
    if _CONTEXT is None:
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        # NOTE: Python 3.11's forkserver ignores the sys.path it is given: it imports PRELOAD with '' (its working
        # directory) first on its path, and skips a module it cannot import. Started in a test's temporary
        # directory, it preloaded none of tests.*, torch with them, and every run imported them again (~1.7 s).
        here = os.open(".", os.O_PATH)  # the test's working directory, maybe gone since
        try:
            os.chdir(REPO)
            forkserver.ensure_running()
        finally:
            os.fchdir(here)
            os.close(here)
        _CONTEXT = context
    return _CONTEXT


def _child(argv: list[str], env: dict[str, str | None], out: str, err: str) -> None:
    # NOTE: the forkserver keeps the working directory of the test that first started it (maybe a temporary
    # directory, gone since): every child starts where pytest runs, the repository root, as a subprocess would
    os.chdir(REPO)
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    from tests.fake_cli import main

    main(argv)  # petal's CLI, with the fake engine when PETAL_TEST_FAKE_ENGINE is set; ends with sys.exit


@dataclass
class Result:
    rc: int  # the exit status; -N when killed by signal N
    stdout: str
    stderr: str
    report: dict[str, Any] | None  # the --json-report, when one was asked for and written

    @property
    def last_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ""


class Child:
    """A running ``petal`` process."""

    def __init__(self, argv: list[str], env: dict[str, str | None]) -> None:
        self._out = tempfile.mkstemp(prefix="petal-out-")[1]
        self._err = tempfile.mkstemp(prefix="petal-err-")[1]
        self.report_path = _report_path(argv)
        if self.report_path is not None:
            self.report_path.unlink(missing_ok=True)
        self.process = _context().Process(target=_child, args=(argv, env, self._out, self._err), daemon=True)
        self.process.start()

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    def send(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)

    def stderr_so_far(self) -> str:
        return Path(self._err).read_text()

    def alive(self) -> bool:
        return self.process.is_alive()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The process stopped (SIGSTOP) for the block, then continued: a writer that holds the lock keeps it
        until the block ends, however slowly a loaded machine runs the steps inside (a fault's ``sleep=S``
        alone bounds that window by S seconds of wall time)."""
        os.kill(self.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.pid, signal.SIGCONT)

    def catches(self, sig: signal.Signals) -> bool:
        """Whether the process has a handler installed for ``sig`` (``SigCgt`` in /proc/PID/status)."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return False
        caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
        return bool(int(caught, 16) >> (int(sig) - 1) & 1)

    def wait_handled(self, sig: signal.Signals, timeout: float = 60) -> None:
        """Wait until the process ran its handler of a first ``sig`` (petal's handler then restores the kernel's
        default): a second signal sent sooner, before a loaded machine scheduled the process, merges with the
        first in the kernel's pending set and is never delivered as a second one."""
        deadline = time.monotonic() + timeout
        while self.alive() and self.catches(sig):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sig.name} not handled in {timeout} s: {self.stderr_so_far()[-2000:]}")
            time.sleep(0.01)

    def wait(self, timeout: float = 120) -> Result:
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
            raise TimeoutError(f"petal did not finish in {timeout} s: {Path(self._err).read_text()[-2000:]}")
        stdout, stderr = Path(self._out).read_text(), Path(self._err).read_text()
        os.unlink(self._out)
        os.unlink(self._err)
        report = None
        if self.report_path is not None and self.report_path.exists():
            report = json.loads(self.report_path.read_text())
        return Result(int(self.process.exitcode), stdout, stderr, report)


def _report_path(argv: list[str]) -> Path | None:
    return Path(argv[argv.index("--json-report") + 1]) if "--json-report" in argv else None


def start(argv: list[str], env: dict[str, str | None] | None = None) -> Child:
    """Start ``petal ARGV`` with ``env`` changes (``None`` unsets a variable)."""
    return Child([str(a) for a in argv], dict(env or {}))


def petal(argv: list[str], env: dict[str, str | None] | None = None, timeout: float = 120) -> Result:
    """Run ``petal ARGV`` to its end."""
    return start(argv, env).wait(timeout)


def _call_child(target: Any, args: tuple[Any, ...], err: str) -> None:
    fd = os.open(err, os.O_WRONLY | os.O_TRUNC)
    os.dup2(fd, 2)
    os.close(fd)
    target(*args)


def call(target: Any, args: tuple[Any, ...], timeout: float = 300) -> tuple[int, str]:
    """``target(*args)`` (a module-level function) in a child forked from the preloaded forkserver, its stderr
    captured: the child's exit status (1 for an uncaught exception, -N when killed by signal N) and stderr."""
    err = tempfile.mkstemp(prefix="petal-call-err-")[1]
    try:
        process = _context().Process(target=_call_child, args=(target, args, err), daemon=True)
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise TimeoutError(f"{target.__name__} did not finish in {timeout} s")
        return int(process.exitcode), Path(err).read_text()
    finally:
        os.unlink(err)
