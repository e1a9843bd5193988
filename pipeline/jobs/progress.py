"""The progress bar of a run on stderr: tqdm's bar on a terminal, plain lines in a log.

NOTE: on a file or pipe (cron's ``2>>index.log``, Airflow's captured stderr, ``systemd``'s journal) tqdm's bar is
a carriage return and a redraw every half second: one line of megabytes that log readers never split, in block
characters. There each redraw is a line of its own, in ASCII, at most every ``LOG_INTERVAL_S``."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from tqdm import tqdm

LOG_INTERVAL_S = 30.0


class LogLines:
    """A stream for tqdm that writes each redraw as one line (its ``\\r`` and padding dropped)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


class RunBar(tqdm):
    """tqdm without its monitor thread.

    NOTE: tqdm starts a ``tqdm_monitor`` thread with its first bar (even a disabled one) and it outlived the run: a
    ``petal.index(..., quiet=True)`` caller was left with a thread waking every 10 s. petal's bars set their own
    ``mininterval``, which is what the monitor would tune; a caller's own tqdm bars keep theirs."""

    monitor_interval = 0


def progress_bar(total: int, *, disable: bool, desc: str, unit: str = "doc") -> tqdm[Any]:
    """tqdm on stderr: a live bar on a terminal, lines every ``LOG_INTERVAL_S`` seconds elsewhere."""
    stream = sys.stderr
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError, OSError):  # NOTE: a closed or replaced stderr is no terminal
        terminal = False
    if terminal:
        return RunBar(total=total, unit=unit, file=stream, disable=disable, desc=desc, dynamic_ncols=True,
                    mininterval=0.5)
    return RunBar(total=total, unit=unit, file=LogLines(stream), disable=disable, desc=desc, ascii=True, ncols=100,
                mininterval=LOG_INTERVAL_S)
