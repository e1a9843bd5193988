"""The output directory: versions, the CURRENT pointer, the store, the writer lock.

```
OUT/CURRENT              names the live version (replaced with os.replace: readers never see a mix)
OUT/versions/<id>/       manifest.json, index.faiss, ids.parquet
OUT/versions/.staging-*  a version being built (never read; removed by the next run)
OUT/store/               committed per-shard embeddings (pipeline/store.py)
OUT/.lock                flock: one writer at a time (released by the kernel, even after kill -9)
```
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError, OutputError, TemporaryFailure
from pipeline.fsutil import fsync_dir, write_bytes_atomic

VERSION_RE = re.compile(r"^v\d{6}-\d{8}T\d{6}Z$")


class OutputDir:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.versions_dir = self.root / "versions"
        self.store_dir = self.root / "store"
        self.current_file = self.root / "CURRENT"
        self.lock_file = self.root / ".lock"

    def prepare(self) -> None:
        """Create the directory tree; ``OutputError`` (exit 73) when that is impossible."""
        try:
            self.versions_dir.mkdir(parents=True, exist_ok=True)
            self.store_dir.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise OutputError(f"cannot create output directory {self.root}: {exc.strerror or exc}") from exc

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the writer lock; a second writer fails at once (exit 75) naming the holder."""
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown holder"
                raise TemporaryFailure(
                    f"{self.root} is being written by another petal ({holder}); retry later") from exc
            info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                               "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})
            os.ftruncate(fd, 0)
            os.pwrite(fd, info.encode(), 0)
            yield
        finally:
            os.close(fd)  # releases the flock

    # --- versions -------------------------------------------------------------------------------

    def current_version(self) -> str | None:
        try:
            name = self.current_file.read_text().strip()
        except FileNotFoundError:
            return None
        if not VERSION_RE.match(name):
            raise ConfigError(f"{self.current_file} names {name!r}, which is not a petal version id")
        return name

    def version_dir(self, version: str) -> Path:
        if not VERSION_RE.match(version):
            raise ConfigError(f"{version!r} is not a petal version id")
        return self.versions_dir / version

    def current_manifest(self) -> dict[str, Any] | None:
        version = self.current_version()
        if version is None:
            return None
        return json.loads((self.version_dir(version) / "manifest.json").read_text())

    def versions(self) -> list[str]:
        if not self.versions_dir.is_dir():
            return []
        return sorted(p.name for p in self.versions_dir.iterdir() if VERSION_RE.match(p.name))

    def new_version_id(self) -> str:
        existing = self.versions()
        number = int(existing[-1][1:7]) + 1 if existing else 1
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        return f"v{number:06d}-{stamp}"

    def staging_dir(self) -> Path:
        path = self.versions_dir / f".staging-{uuid.uuid4().hex[:12]}"
        path.mkdir(parents=True)
        return path

    def clean_staging(self) -> None:
        """Remove versions a crashed run left half-built (never live: CURRENT only names finished ones)."""
        if self.versions_dir.is_dir():
            for path in self.versions_dir.glob(".staging-*"):
                shutil.rmtree(path, ignore_errors=True)
        for tmp in self.root.glob(".CURRENT.tmp-*"):
            tmp.unlink(missing_ok=True)

    def publish(self, staging: Path, version: str) -> Path:
        """Make a fully written staging directory the live version (atomic for readers)."""
        for f in staging.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(staging)
        final = self.version_dir(version)
        os.replace(staging, final)
        fsync_dir(self.versions_dir)
        write_bytes_atomic(self.current_file, f"{version}\n".encode())
        return final

    def prune_versions(self, keep: int) -> list[str]:
        """Delete all but the newest ``keep`` versions (never the live one)."""
        live = self.current_version()
        doomed = [v for v in self.versions()[:-keep] if v != live] if keep > 0 else []
        for version in doomed:
            shutil.rmtree(self.versions_dir / version, ignore_errors=True)
        return doomed


def resolve_index_dir(path: Path) -> tuple[Path, dict[str, Any]]:
    """A version directory and its manifest, from ``OUT`` (follows CURRENT) or a version directory."""
    path = Path(path)
    if (path / "manifest.json").is_file():
        version_dir = path
    else:
        out = OutputDir(path)
        version = out.current_version() if path.is_dir() else None
        if version is None:
            raise ConfigError(f"{path} is not a petal index (no CURRENT or manifest.json); build one with petal index")
        version_dir = out.version_dir(version)
    try:
        manifest = json.loads((version_dir / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {version_dir / 'manifest.json'}: {exc}") from exc
    return version_dir, manifest
