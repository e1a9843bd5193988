"""Where ``--json-report`` goes: ``-`` is stdout; a regular file (or a path not there yet) is replaced
atomically; anything else (a FIFO, a character device such as ``/dev/stdout``, a symlink to one) is
written in place, never renamed over.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from petal.pipeline.reliability.durable import write_bytes_atomic

STDOUT = "-"


def report_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()


def write_report_to(path: Path | str, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` (see the module docstring)."""
    data = report_bytes(obj)
    if str(path) == STDOUT:
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
    write_bytes_atomic(target, data)
