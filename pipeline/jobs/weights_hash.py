"""The model's weights sha256 off the critical path: hashed in a background thread from preflight on.

A run records the weights' sha256 (its model identity: drift checks, store fingerprints, the manifest)
and, beside it, the weight files' stat (name in the model directory, size, mtime_ns, ctime_ns, device,
inode) as they were when
hashing began. A later run whose files have the same stat takes the recorded sha256 at once (the
drift check still runs before the model loads) and the background hash verifies it before anything
is committed or published; a fresh output (nothing to compare with) needs the sha256 only once the
model is loaded, so the hash overlaps the load. A mismatch is exit 78 and nothing is published.

``hashlib`` releases the GIL while it hashes a large buffer, so the thread costs the main thread
(tokenizing, loading) almost nothing.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from petal.engine.loader import ModelSpec, sha256_files
from petal.pipeline.reliability.errors import ConfigError, PetalIOError, quote_path


@dataclass(frozen=True)
class FileStat:
    """What changes when a file is rewritten: a cheap stand-in for its content, checked against the hash."""

    name: str  # in the model directory; NOTE: never the absolute path (an index is portable between hosts)
    size: int
    mtime_ns: int
    ctime_ns: int  # NOTE: a user can restore mtime (touch -d), never ctime: a rewrite in place changes it
    device: int
    inode: int

    @classmethod
    def of(cls, path: Path, root: Path) -> FileStat:
        st = os.stat(path)  # through symlinks (the Hugging Face cache links snapshot files to blobs)
        try:
            name = Path(path).relative_to(root).as_posix()
        except ValueError:
            name = Path(path).name
        return cls(name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev, st.st_ino)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> FileStat | None:
        """``None`` for anything that is not a recorded stat (an older or hand-edited manifest: hash again)."""
        try:
            return cls(str(d["name"]), int(d["size"]), int(d["mtime_ns"]), int(d["ctime_ns"]), int(d["device"]),
                       int(d["inode"]))
        except (KeyError, TypeError, ValueError):
            return None


def stat_files(files: tuple[Path, ...], root: Path) -> tuple[FileStat, ...]:
    return tuple(FileStat.of(f, root) for f in files)


def with_weights_sha256(spec: ModelSpec, sha256: str) -> ModelSpec:
    """A copy of ``spec`` whose ``weights_sha256`` is ``sha256`` (computed or verified elsewhere)."""
    copy = dataclasses.replace(spec)
    # NOTE: functools.cached_property keeps its value in the instance __dict__: seeding it is its documented
    # override, and the frozen dataclass does not see it.
    copy.__dict__["weights_sha256"] = sha256
    return copy


class WeightsHash:
    """sha256 of a model's weight files, computed in a daemon thread; ``stat`` is taken before it starts."""

    def __init__(self, spec: ModelSpec) -> None:
        self.files, self.root = spec.hashed_weight_files, Path(spec.path)
        self.stat = stat_files(self.files, self.root)
        self._sha256: str | None = None
        self._error: BaseException | None = None
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="petal-weights-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._sha256 = sha256_files(self.files, self._cancel.is_set)  # None: cancelled
        except BaseException as exc:  # re-raised in the caller's thread by result()
            self._error = exc

    def cancel(self) -> None:
        """Stop hashing (the run ended early); ``result()`` must not be called after."""
        self._cancel.set()

    def result(self) -> str:
        """The sha256 (waits for the thread). A file that cannot be read: ``PetalIOError`` (74)."""
        self._thread.join()
        if self._error is not None:
            if isinstance(self._error, OSError):
                raise PetalIOError(f"cannot read the model's weights {quote_path(self._error.filename or '')}: "
                                   f"{self._error.strerror or self._error}") from self._error
            raise self._error
        assert self._sha256 is not None, "result() after cancel()"
        return self._sha256

    def recorded(self, stat: tuple[FileStat | None, ...] | None, sha256: str) -> str | None:
        """``sha256`` when the files' stat now is ``stat`` (recorded with it by an earlier run), else ``None``."""
        return sha256 if stat is not None and tuple(stat) == self.stat else None

    def stat_to_record(self) -> tuple[FileStat, ...] | None:
        """The stat to record beside the sha256: ``None`` when a file changed while it was hashed."""
        try:
            return self.stat if stat_files(self.files, self.root) == self.stat else None
        except OSError:
            return None

    def verify(self, used: str, model: str) -> str:
        """The sha256, which must be ``used`` (what the run's settings were built with): else ``ConfigError`` (78)."""
        actual = self.result()
        if actual != used:
            raise ConfigError(f"the weights of {model} changed while petal index ran or since their size and times "
                              f"were recorded (sha256 {used[:12]}... expected, {actual[:12]}... read): nothing was "
                              "published; run again (pass --full to rebuild with the new weights)")
        return actual
