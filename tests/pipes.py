"""A child process's stdout read line by line with a deadline, its stderr drained as it comes.

``proc.stdout.readline()`` waits for ever for a child that hangs or never answers: the test, and the CI run with it,
hang until the run's global limit with nothing said. ``Pipes`` reads both pipes in threads, so each wait has a
deadline and a failure names what it waited for and quotes the child's stderr; leaving its block kills the child.

NOTE: threads, not select/poll on the pipe: in the whole suite this process holds over FD_SETSIZE (1024)
descriptors, and a buffered reader may hold a whole line already read, where poll on the descriptor cannot see it.
"""

from __future__ import annotations

import contextlib
import io
import queue
import subprocess
import sys
import threading
from typing import IO, Any

import pytest

_NOTHING = object()
DEADLINE_S = 120.0  # NOTE: generous: the CI runs the suite on a loaded 2-core machine, and a MiniLM load takes seconds


def _name(args: Any) -> str:
    """``petal query OUT --stdin`` for ``[python, -m, petal.cli.main, query, OUT, --stdin]``."""
    words = [str(a) for a in args] if isinstance(args, (list, tuple)) else [str(args)]
    if words[:3] in ([sys.executable, "-m", "petal.cli.main"], [sys.executable, "-m", "tests.fake_cli"]):
        words = ["petal", *words[3:]]
    return " ".join(words)


class Pipes:
    """``proc``'s stdout as lines and its stderr as text so far, read by threads as the child writes them.

    Use as a context manager: leaving the block kills the child if it still runs. ``line`` and ``finish`` fail the
    test after their deadline, naming what they waited for, with the tail of stderr; ``finish`` replaces
    ``communicate`` (nothing else may read the pipes once they are handed here)."""

    def __init__(self, proc: subprocess.Popen, name: str | None = None) -> None:
        assert proc.stdout is not None and proc.stderr is not None, "Pipes reads stdout=PIPE and stderr=PIPE"
        self.proc = proc
        self.name = name or _name(proc.args)
        self._empty: Any = "" if isinstance(proc.stdout, io.TextIOBase) else b""  # Popen's text= applies to both
        self._lines: queue.Queue[Any] = queue.Queue()  # stdout lines, then None at its end
        self._stdout_ended = False
        self._err: list[Any] = []
        self._readers = [threading.Thread(target=self._read_stdout, args=(proc.stdout,), daemon=True),
                         threading.Thread(target=self._read_stderr, args=(proc.stderr,), daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self, stream: IO[Any]) -> None:
        try:
            while line := stream.readline():
                self._lines.put(line)
        finally:
            self._lines.put(None)  # NOTE: its end, whatever ended the reading: ``line`` says so, never waits on

    def _read_stderr(self, stream: IO[Any]) -> None:
        while line := stream.readline():
            self._err.append(line)

    def stderr(self) -> Any:
        """What the child wrote on stderr so far (``str`` or ``bytes``, as its pipe was opened)."""
        return self._empty.join(list(self._err))

    def _fail(self, problem: str) -> None:
        self._readers[1].join(5)  # NOTE: the child may just have ended: its last words on stderr first
        err = self.stderr()
        text = err if isinstance(err, str) else err.decode(errors="replace")
        pytest.fail(f"{self.name}: {problem}; its stderr:\n{text[-3000:] or '(nothing)'}", pytrace=False)

    def line(self, what: str, timeout: float = DEADLINE_S) -> Any:
        """The next line of stdout (with its line end), waited for at most ``timeout`` seconds: ``what`` names it
        in the failure (``"the answer to 'glaciers'"``)."""
        if self._stdout_ended:
            self._fail(f"stdout ended (exit status {self.proc.poll()}) before {what}")
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            line = _NOTHING  # NOTE: failed outside the except: pytest would print the queue's Empty above it
        if line is _NOTHING:
            self._fail(f"waited {timeout:g} s for {what} on stdout, in vain (the child {self._state()})")
        if line is None:
            self._stdout_ended = True
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
            self._fail(f"stdout ended (exit status {self.proc.poll()}) before {what}")
        return line

    def _state(self) -> str:
        code = self.proc.poll()
        return "still runs" if code is None else f"exited with {code}"

    def finish(self, timeout: float = DEADLINE_S) -> tuple[int, Any, Any]:
        """Close stdin (if this side holds it), wait at most ``timeout`` seconds for the child to exit, and return
        its exit status, the rest of stdout (the lines ``line`` did not take) and all of stderr."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        code: int | None = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = self.proc.wait(timeout)
        if code is None:
            self._fail(f"did not exit within {timeout:g} s")
        for reader in self._readers:
            reader.join(timeout)
            if reader.is_alive():
                self._fail(f"exited with {code}, but its pipes stay open {timeout:g} s on (a child of its own "
                           "holds them?)")
        rest = []
        while not self._stdout_ended and (line := self._lines.get()) is not None:
            rest.append(line)
        self._stdout_ended = True
        return code, self._empty.join(rest), self.stderr()

    def __enter__(self) -> Pipes:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(60)  # NOTE: SIGKILL: only a process in uninterruptible sleep outlives this
        if self.proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        for reader, stream in zip(self._readers, (self.proc.stdout, self.proc.stderr)):
            reader.join(10)
            if not reader.is_alive() and stream is not None:  # NOTE: never closed under a reader blocked in it
                stream.close()
