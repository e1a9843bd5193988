"""An output file a command writes at its end (``petal embed --output``, ``--json-report`` of ``petal index`` and
``petal rebuild``), judged before any work: ``check_output_file`` raises ``OutputError`` (73, "cannot create output")
naming the flag and the path, so a cron job learns at once, not after the model loaded and every text was embedded
(or after the index was published) that its output goes nowhere. ``write_error``: a write of it that failed later.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from petal.pipeline.reliability.durable import name_max, temporary_beside
from petal.pipeline.reliability.errors import DENIED, OutputError, PetalIOError, quote_path


def check_output_file(output: Path, flag: str = "--output") -> None:
    """``output`` (what ``flag`` names) can be created: not a directory, in a directory that exists, a name its file
    system takes; a symbolic link there neither loops nor names a file in a directory that is missing; the temporary
    file beside it can be created (created and removed now: a read-only file system, a directory petal may not
    write, no inode left). A FIFO or a device is written in place: only opened by the writer. A disk that fails while
    it is written is still exit 74 then (``write_error``)."""
    said = f"cannot create {flag} {quote_path(output)}"
    _check_creatable(output, said)
    try:
        mode: int | None = os.stat(output).st_mode  # follows symlinks: what the writer writes
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # NOTE: was 74 'Too many levels of symbolic links' after the work was done
            raise OutputError(f"{said}: it is a loop of symbolic links") from exc
        raise write_error(output, exc, flag) from exc
    if mode is not None and stat.S_ISDIR(mode):
        raise OutputError(f"{said}: it is a directory")
    if mode is None and output.is_symlink():  # NOTE: a dangling link: the writer creates the file it names
        target = output.resolve()
        _check_creatable(target, f"{said}: it is a symbolic link to {quote_path(target)}, which cannot be created")
    if mode is None or stat.S_ISREG(mode):
        # NOTE: the writer's temporary file, created and removed now: a read-only file system, a directory petal may
        # not write, no inode left are said before any work, not after it
        tmp = temporary_beside(output.resolve() if output.is_symlink() else output)
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
            os.unlink(tmp)
        except FileExistsError:  # a leftover of an earlier run of this process id: the writer removes it
            pass
        except OSError as exc:
            raise write_error(output, exc, flag) from exc


def _check_creatable(path: Path, said: str) -> None:
    """``path``'s directory exists and its file system takes ``path``'s name (``OutputError`` starting ``said``)."""
    parent = path.parent
    if not parent.is_dir():
        raise OutputError(f"{said}: {quote_path(parent)} is not a directory")
    size, most = len(os.fsencode(path.name)), name_max(parent)
    if size > most:  # NOTE: said now, not as ENAMETOOLONG (74) after the work was done
        raise OutputError(f"{said}: its name is {size} bytes, longer than the {most} its file system takes; give "
                          "a shorter name")


def write_error(output: Path, exc: OSError, flag: str = "--output") -> OutputError | PetalIOError:
    """A failed write of ``output`` (what ``flag`` names): 73 when petal may not write there (permission denied, a
    read-only file system: a retry fails the same way), else an I/O error (74), naming it."""
    if exc.errno == errno.EROFS:
        return OutputError(f"cannot create {flag} {quote_path(output)}: its file system is read-only; write it "
                           "elsewhere")
    if exc.errno in DENIED:
        return OutputError(f"cannot create {flag} {quote_path(output)}: petal may not write it (permission denied); "
                           "run as a user who may write it, or fix its permissions")
    return PetalIOError(f"cannot write {flag} {quote_path(output)}: {exc.strerror or exc}")


def input_written_over(output: Path | str, inputs: Iterable[Any]) -> tuple[Any, str] | None:
    """The first of ``inputs`` (local paths; object-store URIs and other objects are passed over) that is the regular
    file ``output`` names, by any path (symbolic and hard links too), and how to say so: ``""`` when both are the
    same path, else `` (the same file as INPUT)``; ``None`` when ``output`` is not there, is no regular file (a FIFO
    or a device is written in place, never an input's bytes) or is none of them."""
    try:
        written = os.stat(output)
    except OSError:
        return None
    if not stat.S_ISREG(written.st_mode):
        return None
    for given in inputs:
        if not isinstance(given, (str, Path)) or "://" in str(given):
            continue
        try:
            if os.path.samestat(os.stat(given), written):
                same = os.path.abspath(output) == os.path.abspath(given)
                return given, "" if same else f" (the same file as {quote_path(given)})"
        except OSError:
            continue
    return None
