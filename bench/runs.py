"""What a benchmark run starts and makes, and leaves nothing of: the child processes (``petal index``, ``petal serve``,
the timed one-shot commands), one that fails ending the benchmark with the child's exit code and what it said (never
a traceback of the benchmark's own), and the temporary directories, removed however the run ends."""

from __future__ import annotations

import contextlib
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

from petal.pipeline.reliability.errors import EXIT_SIGNAL_BASE, EXIT_TEMPFAIL, PetalError, one_line


class ChildFailed(PetalError):
    """``what`` exited ``returncode`` (killed by signal N: 128 + N; stopped with 0 while it was needed: 75, safe to
    retry): the benchmark exits with that code, naming the child and the last line of ``stderr`` (its error), or
    ``where`` its error was written."""

    def __init__(self, what: str, returncode: int, stderr: str = "", where: str = "") -> None:
        last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
        said = f": {one_line(last)}" if last else ""
        how = f"exited {returncode}"
        if returncode < 0:
            with contextlib.suppress(ValueError):
                how = f"was killed by {signal.Signals(-returncode).name}"
        elif returncode == 0:  # NOTE: stopped by someone else (petal serve drains on SIGTERM): was exit 128
            how = "stopped (exit 0) before the benchmark ended"
        super().__init__(f"{what} {how}{said}" + (f" ({where})" if where else ""))
        self.exit_code = (returncode if returncode > 0 else EXIT_TEMPFAIL if returncode == 0
                          else EXIT_SIGNAL_BASE - returncode)


@contextlib.contextmanager
def temporary_workdir(prefix: str) -> Iterator[Path]:
    """A work directory ``$TMPDIR/<prefix>*`` (``prefix`` starts with ``petal-``: cli/bench.py's TEMPORARY), removed
    with what it holds when the run ends: success, failure or a stop signal."""
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as name:
        yield Path(name)
