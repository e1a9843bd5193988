"""SIGINT/SIGTERM turned into a flag the run checks at batch boundaries and between phases."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from petal.pipeline.reliability.errors import Interrupted


class StopSignals:
    """While active, SIGINT and SIGTERM set ``signum`` instead of killing the process.

    The run calls ``check()`` at every batch boundary and between phases; it raises ``Interrupted``
    (exit 130/143) once a signal has arrived, so the run unwinds: uncommitted shards are dropped,
    committed ones stay, the lock is released and the report written. A second signal of the same
    kind restores the default action (a second Ctrl-C kills at once).
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def check(self) -> None:
        """Raise ``Interrupted`` if a signal has arrived."""
        if self.signum is not None:
            raise Interrupted(self.signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            signal.signal(signum, signal.SIG_DFL)
        self.signum = signum

    def __enter__(self) -> StopSignals:
        # NOTE: Python runs handlers in the main thread only; elsewhere (a library caller's worker
        # thread) the process keeps its handlers and the flag never sets.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
