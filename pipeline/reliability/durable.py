"""Durable file writes: write beside, fsync, rename, fsync the directory."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def name_max(directory: Path) -> int:
    """The longest file name (bytes) ``directory``'s file system takes (255 where it cannot say)."""
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def temporary_beside(target: Path) -> Path:
    """``target``'s temporary file: ``.NAME.tmp-PID`` in its directory, or, where that name would be longer than the
    file system takes (a NAME of 244 bytes or more, which the file system takes: ENAMETOOLONG after the work was
    done), ``.petal-HASH.tmp-PID`` (HASH: of NAME, so a later run of the same process id still finds and removes a
    leftover). Every file petal writes beside its target and renames over it takes its temporary name here."""
    pid = os.getpid()
    name = f".{target.name}.tmp-{pid}"
    if len(os.fsencode(name)) > name_max(target.parent):
        name = f".petal-{hashlib.sha256(os.fsencode(target.name)).hexdigest()[:16]}.tmp-{pid}"
    return target.with_name(name)


def write_bytes_atomic(path: Path, data: bytes, before_replace: Callable[[], None] | None = None) -> None:
    """``path`` holds either its old content or ``data``, never a mix, even after a crash. A write that fails (a full
    disk, a quota) removes its temp file before the error goes up: it would stay beside ``path`` (a report, a pointer)
    for good, taking the space a full disk lacks. ``before_replace`` runs once ``data`` is written and fsynced, right
    before the rename; what it raises leaves ``path`` as it was (the temp file removed)."""
    tmp = temporary_beside(path)
    # NOTE: a leftover (or planted) temp file is removed first and the new one created exclusively,
    # never through a symlink: a FIFO or a link planted under the temp name cannot block or redirect us.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())
