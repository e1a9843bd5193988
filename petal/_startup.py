"""Ctrl-C while the ``petal`` script starts: one line on stderr and exit 130, never a traceback.

Installed by ``petal/__init__.py`` (the first of petal's code the script runs, before ``typing``, click and the
commands are imported) when the process is the ``petal`` script; ``petal.cli.main``'s group callback hands SIGINT
back to Python (``KeyboardInterrupt``: ``PetalGroup.invoke`` and each run's ``StopSignals`` answer it) once a
command is about to run, and ``main`` takes it again when the command has returned. Only ``os`` and ``signal``:
nothing here may be slow to import.
"""

from __future__ import annotations

import contextlib
import os
import signal
from types import FrameType

MESSAGE = b"petal: interrupted by SIGINT\n"
EXIT_SIGINT = 130  # NOTE: pipeline/reliability/errors.py's EXIT_SIGINT (not imported: too heavy this early)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """Exit 130 now: nothing was started that needs an ending (no lock, no file written, nothing on stdout that
    click.echo did not flush)."""
    with contextlib.suppress(OSError):
        os.write(2, MESSAGE)
    os._exit(EXIT_SIGINT)


def quiet_sigint() -> None:
    """SIGINT ends the process quietly (130) from now on (main thread only; a handler the host set is kept)."""
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _interrupted):
        with contextlib.suppress(ValueError):  # not the main thread: its signals are not this code's
            signal.signal(signal.SIGINT, _interrupted)


def sigint_to_python() -> None:
    """SIGINT raises ``KeyboardInterrupt`` again (a command is about to run and answers it itself)."""
    if signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)

