"""The IVF damage probe of tests/test_open_integrity.py, run in a real child process forked from tests/forkrun.py's
preloaded forkserver (its own pid and exit status: a crash shows as a negative exit code, as a fresh interpreter's)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests import forkrun


def _probe(out: str) -> None:
    import numpy as np

    from petal.pipeline.index.search import IndexReader
    from petal.pipeline.reliability.errors import PetalError

    try:
        r = IndexReader(out, nprobe=8)
        r.search(np.ones((4, 384), "float32") / 20, 50)
    except PetalError as exc:
        print(exc, file=sys.stderr)
        sys.stderr.flush()
        sys.exit(exc.exit_code)


def probe(out: Path, timeout: float = 300) -> tuple[int, str]:
    """Open ``out`` and search it in a child process; its exit code (-N when killed by signal N) and stderr."""
    return forkrun.call(_probe, (str(out),), timeout)
