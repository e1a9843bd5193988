"""Ctrl-C while the ``petal`` script starts: one line on stderr and exit 130, never a traceback.

Installed by ``petal/__init__.py`` (the first of petal's code the script runs, before ``typing``, click and the
commands are imported) when the process is the ``petal`` script; ``petal.cli.main``'s group callback hands SIGINT
back to Python (``KeyboardInterrupt``: ``PetalGroup.invoke`` and each run's ``StopSignals`` answer it) once a
command is about to run, and ``main`` takes it again when the command has returned. Only ``os``, ``sys`` and the
interpreter's own ``_signal``: nothing here may run much Python code before the handler is in place.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # NOTE: not typing's: importing typing this early costs ~5 ms a SIGINT could land in
if TYPE_CHECKING:
    from typing import Any

# NOTE: `_signal`, which the interpreter loaded at its start, not `signal`: importing `signal` runs Python code (its
# enum conversion, ~1 ms) that a SIGINT could interrupt before the handler below is in place, a traceback
_signal: Any = sys.modules.get("_signal") or __import__("signal")
MESSAGE = b"petal: interrupted by SIGINT\n"
EXIT_SIGINT = 130  # NOTE: pipeline/reliability/errors.py's EXIT_SIGINT (not imported: too heavy this early)


def _interrupted(signum: int, frame: Any) -> None:
    """Exit 130 now: nothing was started that needs an ending (no lock, no file written, nothing on stdout that
    click.echo did not flush)."""
    try:  # noqa: SIM105  # NOTE: plain statements, no contextlib: this runs as early as the interpreter allows
        os.write(2, MESSAGE)
    except OSError:
        pass
    os._exit(EXIT_SIGINT)


def quiet_sigint() -> None:
    """SIGINT ends the process quietly (130) from now on (main thread only; a handler the host set is kept)."""
    if _signal.getsignal(_signal.SIGINT) in (_signal.default_int_handler, _interrupted):
        try:  # noqa: SIM105
            _signal.signal(_signal.SIGINT, _interrupted)
        except ValueError:  # not the main thread: its signals are not this code's
            pass


def sigint_to_python() -> None:
    """SIGINT raises ``KeyboardInterrupt`` again (a command is about to run and answers it itself)."""
    if _signal.getsignal(_signal.SIGINT) is _interrupted:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)

