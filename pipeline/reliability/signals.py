"""Stop signals turned into a flag the run checks at batch boundaries and between phases.

| signal | exit | |
|---|---|---|
| SIGINT | 130 | Ctrl-C |
| SIGTERM | 143 | a scheduler's stop or timeout (Airflow, systemd, Kubernetes) |
| SIGHUP | 129 | the terminal or ssh session went away: handled like SIGTERM |
| SIGUSR1 / SIGUSR2 | 138 / 140 | handled like SIGTERM (their default would end the run without a report) |

The first signal asks for a clean stop: the run unwinds at its next check (uncommitted shards
dropped, committed ones kept, the lock released, the report written) and exits 128 + the signal's
number. It also ends a blocking wait at once (the writer lock, the next tokenized chunk): those
run inside ``interruptible()``. From the first signal on, the kernel's default action is restored
for every stop signal, so a second signal kills the process at once, even inside a long C call.
A signal the process was told to ignore (``nohup``'s SIGHUP, a background job's SIGINT) stays ignored.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from petal.pipeline.reliability.errors import Interrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def not_ignored() -> list[int]:
    """The stop signals this process does not ignore: one it was started ignoring is the caller's word (``nohup petal
    index ... &``'s SIGHUP: the run outlives the session; a background job's SIGINT) and stays ignored.

    NOTE: nor one whose handler was installed outside Python (a program embedding the interpreter: uWSGI, a C host;
    ``getsignal`` says None): it cannot be put back (``signal.signal(sig, None)`` is a TypeError), so it is left to
    that handler. Taken, a Python caller's run ended in that TypeError after it published, with petal's handler left
    installed for good (a SIGTERM then set the flag of a finished run and no longer stopped the process)."""
    return [sig for sig in STOP_SIGNALS if signal.getsignal(sig) not in (signal.SIG_IGN, None)]


class StopSignals:
    """While active, the stop signals set ``signum`` instead of killing the process (see module doc)."""

    def __init__(self, second_kills: bool = True) -> None:
        """``second_kills=False``: the handlers stay for the whole run (a worker process, whose coordinator
        forwards the signal the worker may also have had from the terminal, must stop cleanly, not die)."""
        self.second_kills = second_kills
        self.signum: int | None = None
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
        self._blocking = 0

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def check(self) -> None:
        """Raise ``Interrupted`` if a signal has arrived."""
        if self.signum is not None:
            raise Interrupted(self.signum)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """A blocking wait: a stop signal arriving inside it raises ``Interrupted`` at once."""
        self.check()
        self._blocking += 1
        try:
            yield
        finally:
            self._blocking -= 1

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.signum is None
        if first:
            self.signum = signum
        # NOTE: the kernel's default from now on: the next stop signal kills at once (a person who
        # presses Ctrl-C twice, a scheduler that escalates), even while the main thread is in C code.
        if self.second_kills:
            for sig in self._previous:
                signal.signal(sig, signal.SIG_DFL)
        if first and self._blocking:
            raise Interrupted(signum)

    def __enter__(self) -> StopSignals:
        # NOTE: Python runs handlers in the main thread only; elsewhere (a library caller's worker
        # thread) the process keeps its handlers and the flag never sets.
        if threading.current_thread() is threading.main_thread():
            for sig in not_ignored():
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class HeldSignals:
    """A server's stop signals from its first line on: one that arrives before the server runs (imports,
    checks, the model load's start) is held, not fatal. The caller looks at ``signum`` before it binds; the
    server installs its own handlers and acts on one held until then (``DrainingServer.held``)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> HeldSignals:
        """NOTE: a stop signal the server was started ignoring stays ignored (``not_ignored``): ``nohup petal serve
        &`` then a closed terminal's SIGHUP stopped the server, as did a script's Ctrl-C its background server."""
        if threading.current_thread() is threading.main_thread():
            for sig in not_ignored():
                signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
