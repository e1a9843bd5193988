"""A worker process still starting, in which a script's unguarded ``petal.index(..., workers=N)`` runs again.

Python's ``spawn`` starts a worker by running the parent's main script again in it (as ``__mp_main__``) before the
worker's own code. A script that calls ``petal.index`` with ``workers``/``devices`` at its top level, not under
``if __name__ == "__main__":``, calls it again in every worker: there it met the parent's writer lock (75), or
multiprocessing's own "An attempt has been made to start a new process before the current process has finished its
bootstrapping phase", and the worker died before "ready" with a traceback on stderr, quiet=True or not; the run
ended 75, which tells cron or Airflow to retry a mistake that fails the same way every time.

Now ``petal.index``/``petal.rebuild`` called in a petal worker still starting (multiprocessing's own test:
``current_process()._inheriting``, set by ``spawn._main`` while it runs the main script) end the worker at once,
quietly, with ``UNGUARDED_MAIN_EXIT``; the coordinator (``workers._Pool``) raises ``unguarded_main_error``, a
``UsageError`` (2) naming the script and the guard.
"""

from __future__ import annotations

import sys

from petal._startup import WORKER_NAME_PREFIX
from petal.pipeline.reliability.errors import UsageError, quote_path

__all__ = ["UNGUARDED_MAIN_EXIT", "WORKER_NAME_PREFIX", "leave_a_starting_worker", "unguarded_main_error"]
UNGUARDED_MAIN_EXIT = 86  # a worker whose start ran the parent's script into petal.index/rebuild again (no contract
#                           code: only the coordinator sees it)


def leave_a_starting_worker() -> None:
    """End this process with ``UNGUARDED_MAIN_EXIT`` (``SystemExit``: no traceback) when it is a petal worker still
    starting, whose spawn is running the parent's main script: a call of ``petal.index``/``petal.rebuild`` at the
    script's top level. Anywhere else nothing happens (multiprocessing not even imported: not a spawned child)."""
    process_module = sys.modules.get("multiprocessing.process")
    if process_module is None:
        return
    process = process_module.current_process()
    if getattr(process, "_inheriting", False) and process.name.startswith(WORKER_NAME_PREFIX):
        raise SystemExit(UNGUARDED_MAIN_EXIT)


def unguarded_main_error() -> UsageError:
    """The coordinator's error for a worker that ended with ``UNGUARDED_MAIN_EXIT`` before its "ready"."""
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    named = quote_path(script) if script else "the main script"
    return UsageError(f"--workers/--devices start worker processes with Python's spawn, which runs {named} again in "
                      "each of them, and its top-level petal.index(...) (or petal.rebuild) call ran there again: "
                      "keep the script's top level under `if __name__ == \"__main__\":` (nothing was embedded)")
