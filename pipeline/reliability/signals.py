"""Stop signals turned into a flag the run checks at batch boundaries and between phases.

| signal | exit | |
|---|---|---|
| SIGINT | 130 | Ctrl-C |
| SIGTERM | 143 | a scheduler's stop or timeout (Airflow, systemd, Kubernetes) |
| SIGHUP | 129 | the terminal or ssh session went away: handled like SIGTERM (commands only) |
| SIGUSR1 / SIGUSR2 | 138 / 140 | like SIGTERM (commands only: their default would end the run without a report) |

The first signal asks for a clean stop: the run unwinds at its next check (uncommitted shards
dropped, committed ones kept, the lock released, the report written) and exits 128 + the signal's
number. It also ends a blocking wait at once (the writer lock, the next tokenized chunk): those
run inside ``interruptible()``. What a second signal does depends on who owns the process (``Second``):
a command's (``petal index``) restores the kernel's default for every stop signal, so it kills the process at
once, even inside a long C call; a Python caller's run (``petal.index()``, ``StopSignals.for_caller()``) takes
SIGINT and SIGTERM only and hands the second to the handlers the caller had (Python's default SIGINT handler:
``KeyboardInterrupt`` in the caller, which the API still reports as interrupted); a worker process keeps its
handlers (its coordinator forwards signals).
A signal the process was told to ignore (``nohup``'s SIGHUP, a background job's SIGINT) stays ignored.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, Literal

from petal.pipeline.reliability.errors import Interrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
# NOTE: a Python caller's run (the API) takes these only, as the README promises: SIGHUP and SIGUSR1/SIGUSR2 belong to
# the host program (a reload, a stack dump), whose handler must still run while petal.index() does
CALLER_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# what a stop signal after the first does: "kill" (the kernel's default, a command), "caller" (the handlers that were
# there before the scope, a Python caller's), "stop" (the same flag again, a worker whose coordinator forwards signals)
Second = Literal["kill", "caller", "stop"]


def not_ignored(signals: tuple[int, ...] = STOP_SIGNALS) -> list[int]:
    """The stop signals this process does not ignore: one it was started ignoring is the caller's word (``nohup petal
    index ... &``'s SIGHUP: the run outlives the session; a background job's SIGINT) and stays ignored.

    NOTE: nor one whose handler was installed outside Python (a program embedding the interpreter: uWSGI, a C host;
    ``getsignal`` says None): it cannot be put back (``signal.signal(sig, None)`` is a TypeError), so it is left to
    that handler. Taken, a Python caller's run ended in that TypeError after it published, with petal's handler left
    installed for good (a SIGTERM then set the flag of a finished run and no longer stopped the process)."""
    return [sig for sig in signals if signal.getsignal(sig) not in (signal.SIG_IGN, None)]


class StopSignals:
    """While active, the stop signals set ``signum`` instead of killing the process (see module doc)."""

    def __init__(self, second: Second = "kill", signals: tuple[int, ...] = STOP_SIGNALS) -> None:
        """``second``: what a signal after the first does (``Second``; ``"stop"``: the handlers stay for the whole
        run, for a worker process, whose coordinator forwards the signal the worker may also have had from the
        terminal: it must stop cleanly, not die). ``signals``: the ones taken."""
        self.second = second
        self.signals = signals
        self.signum: int | None = None
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
        self._blocking = 0

    @classmethod
    def for_caller(cls) -> StopSignals:
        """A Python caller's run (``petal.index()``, ``petal.rebuild()``): SIGINT and SIGTERM only, and from the first
        one on the caller's own handlers are back (its second Ctrl-C is its ``KeyboardInterrupt``, never a death of
        the caller's process); every handler is as it was once the scope ends."""
        return cls(second="caller", signals=CALLER_STOP_SIGNALS)

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
        # NOTE: "kill": the kernel's default from now on, the next stop signal kills at once (a person who presses
        # Ctrl-C twice, a scheduler that escalates), even while the main thread is in C code. "caller": the caller's
        # handlers from now on (a command's kill would end a REPL, a notebook kernel or a worker framework's process).
        self._after_first()
        if first and self._blocking:
            raise Interrupted(signum)

    def _after_first(self) -> None:
        if self.second != "stop":
            for sig, previous in self._previous.items():
                signal.signal(sig, signal.SIG_DFL if self.second == "kill" else previous)

    def __enter__(self) -> StopSignals:
        # NOTE: Python runs handlers in the main thread only, and only it may install them (else ValueError);
        # elsewhere (a library caller's worker thread) the process keeps its handlers and the flag never sets.
        if threading.current_thread() is threading.main_thread():
            for sig in not_ignored(self.signals):
                self._previous[sig] = signal.signal(sig, self._handle)
            if self.signum is not None:  # NOTE: one came before every handler was in: the later ones too
                self._after_first()
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
