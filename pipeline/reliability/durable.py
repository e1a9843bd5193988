"""Durable file writes: write beside, fsync, rename, fsync the directory."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """``path`` holds either its old content or ``data``, never a mix, even after a crash. A write that fails (a full
    disk, a quota) removes its temp file before the error goes up: it would stay beside ``path`` (a report, a pointer)
    for good, taking the space a full disk lacks."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
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
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())
