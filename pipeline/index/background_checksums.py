"""sha256 (then fsync) of a version's files in worker threads, started as each file is finished.

Hashing a 500 MB ``index.faiss`` costs about as long as writing it; started the moment the file is
closed, it runs beside the rest of the version's writing (``ids.parquet``, stored columns, rejects),
and the fsync that follows makes the publish's own fsync (``OutputDir.publish``) nearly free.
``hashlib`` and ``os.fsync`` release the GIL.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from petal.pipeline.index.checksums import sha256_file

WORKERS = 2


def _hash_and_sync(path: Path) -> str:
    digest = sha256_file(path)
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())
    return digest


class BackgroundChecksums:
    """``add(path)`` when a file is written for good; ``result()`` waits for every sha256 (name -> sha256)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="petal-checksum")
        self._futures: dict[str, tuple[Path, Future[str]]] = {}

    def add(self, path: Path) -> None:
        """Hash ``path`` now; a file added again (rewritten since) is hashed again and the later sha256 wins."""
        self._futures[path.name] = (path, self._pool.submit(_hash_and_sync, path))

    def names(self) -> set[str]:
        return set(self._futures)

    def result(self) -> dict[str, str]:
        """Every added file's sha256 by name (re-raises a read error, as the synchronous hash did)."""
        try:
            return {name: future.result() for name, (_, future) in sorted(self._futures.items())}
        finally:
            self._pool.shutdown(wait=True)

    def cancel(self) -> None:
        """The build failed: drop what has not started, wait for what has (the caller removes the files)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
