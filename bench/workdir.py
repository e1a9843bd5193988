"""What ``petal bench`` may remove or overwrite in a directory the user names (``--workdir``): only what it wrote.

Each directory a benchmark writes entries into keeps ``.petal-bench.json``, the names of the entries it wrote there,
each recorded before it is written (a run stopped while writing one still knows it as its own). An entry a run would
write, overwrite or remove that is there and not recorded (a user's index, a file of theirs named like a shard) is
refused (``OutputError``, 73, naming it) and left as it is. ``.petal-bench.lock`` in ``--workdir``: one benchmark at a
time there (a ``flock``, released by the kernel, even after kill -9); a second is refused (75) naming the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from petal.pipeline.reliability.errors import OutputError, TemporaryFailure, quote_path

RECORD = ".petal-bench.json"
LOCK = ".petal-bench.lock"


class Written:
    """The entries of ``root`` (names relative to it) that petal bench wrote, as its record lists them; ``flag``
    names the directory in messages."""

    def __init__(self, root: Path, flag: str = "--workdir") -> None:
        self.root = Path(root)
        self.flag = flag

    def names(self) -> list[str]:
        path = self.root / RECORD
        try:
            names = json.loads(path.read_text())["written"]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise OutputError(f"{self.flag} {quote_path(path)} is not petal bench's record of what it wrote there "
                              f"({exc}); give another {self.flag} or remove it") from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise OutputError(f"{self.flag} {quote_path(path)} is not petal bench's record of what it wrote there; "
                              f"give another {self.flag} or remove it")
        return names

    def check(self, *names: str) -> None:
        """Each of ``names`` is absent or petal bench's own; else ``OutputError`` (73) naming it."""
        own = set(self.names())
        for name in names:
            path = self.root / name
            if name not in own and os.path.lexists(path):
                raise OutputError(f"{self.flag} {quote_path(path)} was not written by petal bench; give another "
                                  f"{self.flag} or remove it")

    def claim(self, name: str) -> Path:
        """``root/name``, recorded as petal bench's before the caller writes it (``check`` first)."""
        self.check(name)
        names = self.names()
        if name not in names:
            self._record([*names, name])
        return self.root / name

    def remove(self, name: str) -> None:
        """Remove ``root/name`` (a directory with what it holds), which petal bench recorded, and its record."""
        names = self.names()
        assert name in names, f"{name} is not petal bench's"
        path = self.root / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        self._record([n for n in names if n != name])

    def _record(self, names: list[str]) -> None:
        from petal.pipeline.reliability.durable import write_bytes_atomic

        self.root.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(self.root / RECORD, json.dumps({"written": names}).encode())


@contextlib.contextmanager
def workdir_lock(workdir: Path, command: str) -> Iterator[None]:
    """Hold ``workdir``'s bench lock while ``petal bench COMMAND`` runs (``workdir`` is made if missing); held by
    another process: ``TemporaryFailure`` (75) at once naming it."""
    from petal.pipeline.layout import lock_holder, record_lock_holder, why_no_lock

    Path(workdir).mkdir(parents=True, exist_ok=True)
    path = Path(workdir) / LOCK
    try:
        # NOTE: O_NOFOLLOW, O_NONBLOCK: a symlink planted as the lock redirects nothing, a FIFO blocks nothing
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise OutputError(f"--workdir {quote_path(path)}: cannot open petal bench's lock file: "
                          f"{why_no_lock(exc, path)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OutputError(f"--workdir {quote_path(path)} is not a regular file; petal bench locks it: remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TemporaryFailure(f"--workdir {quote_path(workdir)} is in use by another petal bench "
                                   f"({lock_holder(os.pread(fd, 4096, 0))}); wait for it to end, or give another "
                                   "--workdir") from None
        record_lock_holder(fd, command=f"petal bench {command}")
        yield
    finally:
        os.close(fd)  # releases the flock
