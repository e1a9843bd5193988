"""The Python API's open and search of an index in its own process, forked from tests/forkrun.py's preloaded
forkserver (a crash, SIGBUS or SIGSEGV, ends that child, not the test run): what ``python -c`` of the same lines
did, without a fresh interpreter's imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import forkrun


def _search(out: str, where: str) -> None:
    import numpy as np

    import petal
    from petal.pipeline.reliability.errors import PetalError

    try:
        with petal.open_index(out) as index:
            index.search_stored(np.ones((2, index.dim), np.float32), k=5, where=where or None)
    except PetalError as exc:
        print(exc, file=sys.stderr)
        sys.exit(exc.exit_code)


def api(out: Path, where: str = "", timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``petal.open_index(out)`` and a search of two rows (``where`` if given) in a child process: exit 0, the
    ``PetalError``'s code with its message on stderr, 1 with a traceback, or -N when killed by signal N."""
    rc, stderr = forkrun.call(_search, (str(out), where), timeout)
    return subprocess.CompletedProcess(["api", str(out), where], rc, "", stderr)
