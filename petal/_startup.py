"""A stop signal while the ``petal`` script starts: one line on stderr and exit 128 + its number, never a traceback
and never a death by the signal (SIGINT 130, SIGTERM 143, SIGHUP 129, SIGUSR1/SIGUSR2 138/140: the stop signals of
``pipeline/reliability/signals.py``).

Installed by ``petal/__init__.py`` (the first of petal's code the script runs, before ``typing``, click and the
commands are imported) when the process is the ``petal`` script; ``petal.cli.main``'s group callback hands the
signals back to Python once a command is about to run (SIGINT raises ``KeyboardInterrupt``, the others
``StopSignal``, a ``KeyboardInterrupt`` too: ``PetalGroup.invoke`` and each run's ``StopSignals`` answer them), and
``main`` takes them again when the command has returned. A signal the process was started ignoring (``nohup``'s
SIGHUP, a background job's SIGINT) stays ignored. Only ``os``, ``sys`` and the interpreter's own ``_signal``: nothing
here may run much Python code before the handlers are in place.
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
# signal number -> name; the numbers differ between systems (SIGUSR1 is 10 on Linux, 30 on macOS)
NAMES = {getattr(_signal, name): name for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")}
# NOTE: `petal serve` (the group takes no option before the command): a stop signal before it serves ends it with 0,
# as its HeldSignals do from its callback's first line on (cli/serve.py says the same words)
SERVE = sys.argv[1:2] == ["serve"]
# NOTE: a worker process of `--workers`/`--devices` (multiprocessing's spawn gives it the script's argv): a stop signal
# the coordinator passes on while it starts ends it quietly; the coordinator says it once (a line per worker, before)
CHILD = "multiprocessing.spawn" in sys.modules
WORKER_NAME_PREFIX = "petal-worker-"  # the name every worker is spawned with (``workers.embed_in_pool``)


class StopSignal(KeyboardInterrupt):
    """A stop signal other than SIGINT while a command runs: unwinds as Ctrl-C does, and says which (``signum``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def message(signum: int) -> str:
    return f"petal: interrupted by {NAMES.get(signum, signum)}"


def _interrupted(signum: int, frame: Any) -> None:
    """Exit 128 + ``signum`` now (``petal serve``: 0): nothing was started that needs an ending (no lock, no file
    written, nothing on stdout that click.echo did not flush)."""
    said = f"petal serve: stopped ({NAMES.get(signum, signum)} before the server started)" if SERVE else \
        message(signum)
    if not CHILD:
        try:  # noqa: SIM105  # NOTE: plain statements, no contextlib: this runs as early as the interpreter allows
            os.write(2, (said + "\n").encode())
        except OSError:
            pass
    os._exit(0 if SERVE else 128 + signum)


def _raise(signum: int, frame: Any) -> None:
    raise StopSignal(signum)


def _python_default(signum: int) -> Any:
    return _signal.default_int_handler if signum == _signal.SIGINT else _signal.SIG_DFL


def quiet_signals() -> None:
    """Each stop signal ends the process quietly (128 + its number) from now on (main thread only; a handler the
    host set, or an ignored signal, is kept)."""
    for signum in NAMES:
        if _signal.getsignal(signum) in (_python_default(signum), _interrupted, _raise):
            try:
                _signal.signal(signum, _interrupted)
            except ValueError:  # not the main thread: its signals are not this code's
                return


def signals_to_python() -> None:
    """SIGINT raises ``KeyboardInterrupt`` again, the other stop signals ``StopSignal`` (a command is about to run
    and answers them itself). ``petal serve`` keeps them until its HeldSignals take them over."""
    if SERVE:
        return
    for signum in NAMES:
        if _signal.getsignal(signum) is _interrupted:
            _signal.signal(signum, _signal.default_int_handler if signum == _signal.SIGINT else _raise)


def take_in_starting_worker() -> None:
    """In a petal worker still starting (``spawn`` importing its main script and its target: torch, pyarrow, the
    engine's module, seconds): its stop signals, blocked since its spawn (``workers._stop_signals_held``), end it
    quietly (128 + the signal's number, no line: the coordinator says it once) from here on, as ``worker_main`` would
    once it runs. Anywhere else nothing happens.

    NOTE: called by ``petal/__init__.py``, the first of petal's code a worker's start runs. Before, the signals stayed
    blocked until ``worker_main``: a Ctrl-C or the SIGTERM the coordinator passed on waited for every import."""
    process_module = sys.modules.get("multiprocessing.process")
    if process_module is None:  # not a spawned child
        return
    process = process_module.current_process()
    if not (getattr(process, "_inheriting", False) and process.name.startswith(WORKER_NAME_PREFIX)):
        return
    quiet_signals()
    if hasattr(_signal, "pthread_sigmask"):
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, list(NAMES))
