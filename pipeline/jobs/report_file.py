"""Where ``--json-report`` goes: ``-`` is stdout; a regular file (or a path not there yet) is replaced
atomically; anything else (a FIFO, a character device such as ``/dev/stdout``, a symlink to one) is
written in place, never renamed over. Never over a file of a petal output directory (``CURRENT``, ``.lock``,
``.last-version``, anything under ``versions/`` or ``store/``): the run refuses such a path before any work (2),
and the writer never writes there (a warning). A path the report cannot be written to (its directory missing, not
writable, a directory there) is refused before any work too (73, ``check_report_file``); a report that cannot be
written at the end (a full disk) removes the earlier run's report there, never left to be read as this run's.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from petal.pipeline.reliability.durable import write_bytes_atomic
from petal.pipeline.reliability.errors import UsageError, quote_path

STDOUT = "-"
# NOTE: what petal keeps at the top of an output directory (pipeline/layout.py): a report written over one of them
# (``--json-report OUT/CURRENT``) broke the index, one under ``store/tmp`` was deleted by the next run's clean-up
INDEX_NAMES = ("CURRENT", ".lock", ".last-version", ".pruning", "versions", "store")


def index_file_of(path: Path | str, out: Path | str | None = None) -> Path | None:
    """The petal output directory (``out``, or any directory the path lies in that is one) of which ``path`` names
    one of its own files (``INDEX_NAMES`` and below, or a temp file of its ``CURRENT``), where the path leads
    (symlinks resolved); ``None`` otherwise."""
    from petal.pipeline.layout import is_output_dir

    if str(path) == STDOUT:
        return None
    real = Path(os.path.realpath(path))
    given = [Path(os.path.realpath(out))] if out else []
    for root in [*given, *real.parents]:
        try:
            first = real.relative_to(root).parts[0]
        except (ValueError, IndexError):
            continue
        if (first in INDEX_NAMES or first.startswith(".CURRENT")) and (root in given or is_output_dir(root)):
            return root
    return None


def check_report_path(path: Path | str | None, out: Path | str) -> None:
    """``--json-report`` names no file of the output directory ``out`` (or of another index): ``UsageError``."""
    root = None if path is None else index_file_of(path, out)
    if root is not None:
        raise UsageError(f"--json-report {quote_path(path)} is a file of the petal output directory "
                         f"{quote_path(root)} ({', '.join(INDEX_NAMES[:3])}, versions/ and store/ are its own); "
                         "write the report outside them")


def check_report_file(path: Path | str | None, out: Path | str) -> None:
    """Before any work: the report can be written where ``--json-report`` says (``check_output_file``: its directory
    there, not a directory itself, the temporary file beside it creatable): else ``OutputError`` (73) naming it. A
    report inside the output directory ``out``, not created yet, is judged with it (``--out``'s own check).
    NOTE: a report that could not be written was a warning after the whole run, exit 0: a cron job lost it silently."""
    from petal.pipeline.reliability.output_file import check_output_file

    if path is None or str(path) == STDOUT:
        return
    target = Path(path)
    if not target.parent.exists() and os.path.realpath(target.parent) == os.path.realpath(out):
        return
    check_output_file(target, "--json-report")


class ReportOverInput(UsageError):
    """``--json-report`` names an input of the run: the failed run's report is not written there either."""


def check_report_not_input(path: Path | str | None, inputs: Iterable[Any]) -> None:
    """``--json-report`` names none of the run's ``inputs`` (a SOURCE shard, a shard the live version keeps, the
    ``--delete`` file; the same file by any path: symlinks, hard links): ``UsageError`` (2) naming it. NOTE: the report
    was written over it after the run (``petal index --json-report data/*.parquet ...`` takes the first shard): the
    input's rows were gone, and the next run refused the shard as corrupt (65)."""
    from petal.pipeline.reliability.output_file import input_written_over

    if path is None or str(path) == STDOUT:
        return
    over = input_written_over(path, inputs)
    if over is not None:
        raise ReportOverInput(f"--json-report {quote_path(path)} is an input of this run{over[1]}; the report would "
                              "be written over it: write the report elsewhere")
    holds = not_a_report(path)
    if holds is not None:  # NOTE: a file of the user's that no flag of this run names (a shard of another corpus)
        raise ReportOverInput(refused_over(path, holds))


def not_a_report(path: Path | str) -> str | None:
    """What the regular file at ``path`` holds when it is not a report petal may replace (an earlier report starts
    with ``{``; an empty file holds nothing): ``Parquet data`` or ``other data``; ``None`` otherwise (not there, not a
    regular file, empty, JSON). Opened without blocking, never through a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not head.strip() or head.lstrip()[:1] == b"{":
        return None
    return "Parquet data" if head.startswith(b"PAR1") else "other data"


def refused_over(path: Path | str, holds: str) -> str:
    return (f"--json-report {quote_path(path)} holds {holds}, not a petal report; the report is not written over it: "
            "write it elsewhere")


def report_bytes(obj: Any, one_line: bool = False) -> bytes:
    """The report as JSON (ASCII: other characters as escapes); indented for a file, one line for stdout (``--json``,
    ``--json-report -``: one object a line, as every petal command's machine output; Airflow's XCom takes the last)."""
    return (json.dumps(obj, indent=None if one_line else 2, sort_keys=True, default=str) + "\n").encode()


def write_report_to(path: Path | str, obj: Any, out: Path | str | None = None) -> None:
    """Write ``obj`` as JSON to ``path`` (see the module docstring). ``out``: the run's output directory. A path
    that is a file of an output directory is a ``UsageError`` (a ``ValueError``: the caller warns), nothing written."""
    check_report_path(path, out or "")
    data = report_bytes(obj, one_line=str(path) == STDOUT)
    if str(path) == STDOUT:
        if sys.stdout is None:  # NOTE: started with fd 1 closed (>&-, a supervisor that gives none): nowhere to write
            raise OSError(errno.EBADF, "stdout is closed")
        sys.stdout.flush()
        sys.stdout.write(data.decode())
        sys.stdout.flush()
        return
    target = Path(path)
    try:
        mode = os.stat(target).st_mode  # follows symlinks: what the path leads to
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        with open(target, "wb") as fh:  # NOTE: a FIFO or device: no temp file, no rename over it
            fh.write(data)
        return
    if target.is_symlink():  # a symlink to a regular file (or to nothing yet): replace the file it names
        target = target.resolve()
    holds = not_a_report(target)
    if holds is not None:  # NOTE: a usage error's report, written before any input is known, replaced a shard
        raise ValueError(refused_over(path, holds))
    try:
        write_bytes_atomic(target, data)
    except OSError:
        # NOTE: the report there is an earlier run's (``not_a_report`` passed it): left in place (a full disk), a
        # task reading it after this run took the last success's report, exit 0, for this run's. Removed, best effort
        with contextlib.suppress(OSError):
            with open(target, "rb") as fh:
                earlier = fh.read(1) == b"{"
            if earlier:
                os.unlink(target)
        raise
