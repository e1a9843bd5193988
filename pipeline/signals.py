"""SIGINT/SIGTERM turned into a flag the pipeline checks at batch boundaries."""

from __future__ import annotations

import signal
import threading
from types import FrameType


class StopSignals:
    """While active, SIGINT and SIGTERM set ``signum`` instead of killing the process.

    A second signal of the same kind restores the default action (a second Ctrl-C still kills).
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            signal.signal(signum, signal.SIG_DFL)
        self.signum = signum

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()
