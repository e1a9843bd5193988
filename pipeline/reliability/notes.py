"""What a run says beside its report (notes, warnings, "waiting for the writer lock"): ``petal: ...`` lines on stderr.

Inside ``quiet_notes()`` (the API's ``quiet=True``) they go to the ``petal`` logger instead (``warning: ...`` lines at
WARNING, the others at INFO, without the ``petal: `` prefix), so a library call embedded in an Airflow task or a web
service writes nothing to the process's stderr; ``notes_on_stderr()`` (the CLI, whose ``-q`` only hides the progress
bar) keeps them on stderr whatever the call asks. The logger has a ``NullHandler``: without a handler of the caller's,
logging's last resort would print them on stderr after all.

NOTE: the choice is a context variable, so concurrent calls in threads each keep their own; a thread a run starts
does not inherit it (what it says goes to stderr).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Iterator

from petal.pipeline.reliability.errors import one_line

LOGGER = logging.getLogger("petal")
LOGGER.addHandler(logging.NullHandler())

_ON_STDERR = contextvars.ContextVar("petal_notes_on_stderr", default=True)
_FORCED = contextvars.ContextVar("petal_notes_forced", default=False)


def say(message: str) -> None:
    """``message`` said as ``petal: MESSAGE`` on stderr, or to the ``petal`` logger inside ``quiet_notes()``."""
    line = one_line(message)
    if _ON_STDERR.get() or _FORCED.get():
        print(f"petal: {line}", file=sys.stderr, flush=True)
    else:
        LOGGER.log(logging.WARNING if line.startswith("warning:") else logging.INFO, line)


@contextlib.contextmanager
def quiet_notes(quiet: bool = True) -> Iterator[None]:
    """Notes to the ``petal`` logger, not stderr, for the block (when ``quiet``; outside ``notes_on_stderr()``)."""
    token = _ON_STDERR.set(not quiet)
    try:
        yield
    finally:
        _ON_STDERR.reset(token)


@contextlib.contextmanager
def notes_on_stderr() -> Iterator[None]:
    """Notes on stderr for the block, even inside ``quiet_notes()`` (the CLI's ``-q`` hides the progress bar only)."""
    token = _FORCED.set(True)
    try:
        yield
    finally:
        _FORCED.reset(token)
