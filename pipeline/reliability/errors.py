"""Errors a user can act on, each with the process exit code it maps to (the cron/Airflow contract).

| code | meaning |
|---|---|
| 0 | success (also: nothing to do) |
| 1 | internal error (a bug: traceback is printed) |
| 2 | usage error (bad flags) |
| 65 | bad input data (corrupt shard, wrong column type, too many bad rows) |
| 66 | no input (no shards, no rows) |
| 73 | cannot create output |
| 74 | I/O error (disk full, read error after retries) |
| 75 | temporary failure, safe to retry (output locked, CUDA error that needs a new process) |
| 78 | configuration error (model missing or unsafe, settings differ from the index being resumed) |
| 130 / 143 | interrupted by SIGINT / SIGTERM (finished work kept, resumable) |
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from petal.pipeline.jobs.report import RunReport

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_DATAERR = 65
EXIT_NOINPUT = 66
EXIT_CANTCREAT = 73
EXIT_IOERR = 74
EXIT_TEMPFAIL = 75
EXIT_CONFIG = 78
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


class PetalError(Exception):
    """A failure explained to the user (no traceback), ending the process with ``exit_code``."""

    exit_code = EXIT_INTERNAL
    status = "failed"
    report: RunReport | None = None  # the finished report of the run it ended (Python API: index, rebuild)


class UsageError(PetalError, ValueError):
    """A bad argument or setting (the CLI's usage error, exit 2); also a ``ValueError`` for Python callers."""

    exit_code = EXIT_USAGE


class BadInputError(PetalError):
    exit_code = EXIT_DATAERR


class NoInputError(PetalError):
    exit_code = EXIT_NOINPUT


class OutputError(PetalError):
    exit_code = EXIT_CANTCREAT


class PetalIOError(PetalError):
    """Disk full, a read-only or failing disk, a read error that outlived its retries (exit 74)."""

    exit_code = EXIT_IOERR


class TemporaryFailure(PetalError):
    exit_code = EXIT_TEMPFAIL


class ConfigError(PetalError):
    exit_code = EXIT_CONFIG


class Interrupted(PetalError):
    """A clean stop at a batch boundary after SIGINT/SIGTERM (finished shards are committed)."""

    status = "interrupted"

    def __init__(self, signum: int) -> None:
        import signal

        name = signal.Signals(signum).name
        super().__init__(f"interrupted by {name}; finished shards are committed, rerun to resume")
        self.exit_code = EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM


# NOTE: faiss reports a failed write as a RuntimeError ("write error in PATH: ... (No space left on
# device)", "could not open PATH for writing: ..."), not as an OSError.
FAISS_WRITE_ERRORS = ("write error in", "could not open")


@contextlib.contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """An I/O error while writing ``path`` (disk full, read-only, failing disk) becomes exit 74 naming it."""
    try:
        yield
    except OSError as exc:
        raise PetalIOError(f"cannot write {exc.filename or path}: {exc.strerror or exc}") from exc
    except RuntimeError as exc:
        message = str(exc)
        marker = next((m for m in FAISS_WRITE_ERRORS if m in message), None)
        if marker is None:
            raise
        raise PetalIOError(f"cannot write {path}: {message[message.index(marker):].strip()}") from exc
