"""The output directory: versions, the CURRENT pointer, the store, the writer lock.

```
OUT/CURRENT              names the live version (replaced with os.replace: readers never see a mix)
OUT/.last-version        the last version id handed out (high-water mark: a number is never used twice)
OUT/.pruning             the pruning a publish owes (its version, --keep-versions) until it is done
OUT/versions/<id>/       manifest.json, index.faiss, ids.parquet
OUT/versions/.staging-*  a version being built (never read; removed by the next run)
OUT/versions/.deleting-* a superseded version on its way out (removed by the next run)
OUT/store/               committed per-shard embeddings (pipeline/store/embeddings.py)
OUT/rejects.parquet      the bad rows of the last run refused for them (--strict, --max-bad-rows)
OUT/.lock                flock: one writer at a time (released by the kernel, even after kill -9)
```

A reader that keeps a version open (``petal serve``: the version it serves) holds a lease on it, a shared
flock on its ``manifest.json`` (``VersionLease``): pruning leaves a leased version on disk, and the kernel
drops the lease when the reader closes it or dies (kill -9 included), so a dead reader never pins a version.

Versions are numbered in publish order and a run makes its version live before it ends, so a
version newer than the live one is the leftover of a run that died between the rename and the
pointer swap, or, after a rollback by hand, one that was live. The next run that publishes a version removes it,
after its pointer swap (``prune_versions``: newer than the live version the run started from); a run refused,
failed, stopped or with nothing to publish leaves it (it may be the version to roll forward to again). One whose
manifest is missing or is no manifest (no version petal wrote whole) is removed by the next writer's clean-up
(``clean_orphans``). Neither goes while the live version's manifest does not read: the pointer may be what is wrong.

A publish checks, right before its pointer swap, that ``CURRENT`` still holds what it held when the run took the
lock (``StartedFrom``): a rollback by hand during a run is never overwritten (75, nothing published).

A version id names one index for the life of OUT: ``.last-version`` records each id before its version is
written (``new_version_id``), and the next number is past both it and every version on disk, so an id removed
(never live, or after a rollback) is never handed out again, and a new id sorts after every id on disk (the
ordering ``clean_orphans`` and ``prune_versions`` rely on).

Old versions are pruned after a publish, with the publishing run's ``--keep-versions``; a run that publishes nothing
prunes none by its own. ``.pruning`` records, before the pointer swap, the pruning a publish owes (with the live
version the run started from: the versions newer than it go too); it is removed once that pruning is done, so one a
crash, a stop signal or a reader's lease cut short is finished by the next run (``finish_pruning``), a run that
publishes nothing included.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from petal.pipeline.ingest.remote import local_path
from petal.pipeline.manifest import MANIFEST_FILE, Manifest
from petal.pipeline.reliability.durable import fsync_dir, write_bytes_atomic
from petal.pipeline.reliability.errors import (
    BadInputError,
    ConfigError,
    NoInputError,
    OutputError,
    PetalError,
    PetalIOError,
    TemporaryFailure,
    one_line,
    quote_path,
    quote_text,
    writing,
)
from petal.pipeline.reliability.faults import fault
from petal.pipeline.reliability.leftovers import leave, remove_or_leave
from petal.pipeline.reliability.notes import say
from petal.pipeline.reliability.safe_files import (
    KINDS,
    READ_ONLY,
    UnsafeFileError,
    inside,
    read_regular,
    why_not_writable,
)
from petal.pipeline.store.side_files import KEY_TREES

VERSION_RE = re.compile(r"^v\d{6}-\d{8}T\d{6}Z$")
LOCK_POLL_S = 0.2
# NOTE: a lock held only shared is no writer: a starting run's probe (check_unlocked) holds it an instant, so a writer
# retries it this long before it refuses (was: refused at once, 75, while no writer ran)
SHARED_GRACE_S = 2.0
SHARED_RETRY_S = 0.01
HOLDER_RECORD_S = 1.0  # how long a refusal waits for a writer that just took the lock to record itself in .lock
LAST_VERSION_FILE = ".last-version"
PRUNING_FILE = ".pruning"
MAX_VERSION_NUMBER = 999_999  # VERSION_RE: six digits, so that ids sort as strings in number order
POINTER_MAX_BYTES = 256  # CURRENT holds one version id; more is not read (never echoed either)
PRUNING_MAX_BYTES = 1 << 16  # .pruning: a version id, --keep-versions, and the newer versions a rollback left
# NOTE: the most of a pointer that is no version id a refusal shows (petal serve's /ready too): past the 24 characters
# of an id, so that one that starts with a valid id ('v...Z.bak', two ids on two lines) shows what is wrong with it
# (it was cut at 24: exactly the valid id, followed by '...')
SHOWN_POINTER_CHARS = 64
MANIFEST_MAX_BYTES = 64 << 20
MAX_LISTED_VERSIONS = 5  # the complete versions a recovery hint offers (each one checked as opening it would)


def is_output_dir(path: Path) -> bool:
    """True for a petal output directory (``CURRENT`` with ``versions/``, or a ``store/`` of shards)."""
    path = Path(path)
    try:
        return ((path / "versions").is_dir() and (path / "CURRENT").exists()) or (path / "store" / "shards").is_dir()
    except OSError:
        return False


def check_not_inside_output(flag: str, out: Path) -> None:
    """``out`` is not inside another petal output directory's ``versions/`` or ``store/`` (``OutputError``, 73,
    before anything is read): an index written there would be mixed into that one's own files, which its runs list,
    prune and clean up as theirs."""
    real = Path(os.path.realpath(out))
    for parent in real.parents:
        if is_output_dir(parent):
            part = real.relative_to(parent).parts[0]
            if part in ("versions", "store"):
                raise OutputError(f"{flag} {quote_path(out)} lies inside the {part}/ of the petal output directory "
                                  f"{quote_path(parent)}; give a directory outside it")


@dataclass(frozen=True)
class StartedFrom:
    """What ``CURRENT`` held when a writer took the lock (``OutputDir.started_from``)."""

    pointer: str | None  # its text (None: no pointer); the publish swaps the pointer only while it holds this still
    version: str | None  # the live version, when its manifest reads and records it (OutputDir.live_is_valid), else
    # None: the versions newer than it are removed once the run has published (CURRENT set back from them by hand)


@dataclass(frozen=True)
class OwedPruning:
    """``.pruning``: the pruning a publish owes (``OutputDir.publish``), until it is done."""

    version: str  # the version the publish made live
    keep_versions: int  # its run's --keep-versions
    since: str | None  # the live version its run started from (the versions newer than it go too)
    newer: tuple[str, ...] = ()  # versions newer than a rollback target that an earlier publish's pruning owed


class OutputDir:
    def __init__(self, root: Path, left: list[dict[str, str]] | None = None) -> None:
        """``left``: where what its clean-up and pruning cannot remove is listed (a run report's ``pruned.left``)."""
        self.root = local_path(root)  # NOTE: 'a:b' would be a URI to pyarrow
        self.versions_dir = self.root / "versions"
        self.store_dir = self.root / "store"
        self.current_file = self.root / "CURRENT"
        self.last_version_file = self.root / LAST_VERSION_FILE
        self.pruning_file = self.root / PRUNING_FILE
        self.lock_file = self.root / ".lock"
        self.rejects_file = self.root / "rejects.parquet"
        self._copies_said: set[str] = set()  # NOTE: clean-up and pruning each meet them: said once a run
        self.left = left if left is not None else []  # what clean-up and pruning could not remove (said on stderr)

    def prepare(self) -> None:
        """Create the directory tree; ``OutputError`` (exit 73) when that is impossible."""
        try:
            self._check_tops()  # NOTE: inside the try: a stat refused (an OUT that cannot be entered) is 73 too
            self.versions_dir.mkdir(parents=True, exist_ok=True)
            self.store_dir.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink(missing_ok=True)  # NOTE: a writer's clean_orphans may have removed it already
        except OSError as exc:
            raise _cannot_create(exc, self.root, f"cannot create output directory {quote_path(self.root)}: "
                                 f"{exc.strerror or exc}") from exc
        # NOTE: as OUT itself (check_output_dir): a directory of OUT that petal may not read, enter or write is 73
        # naming it, before the lock; else the first file written under it (a store entry, a tombstone) was named
        for sub in (self.versions_dir, self.store_dir, self.store_dir / "shards"):
            _check_usable(sub)
        self._check_key_trees()

    def check_tree(self) -> None:
        """What ``prepare`` checks of the tree, for a writer that creates nothing (``petal rebuild``): ``versions/``,
        ``store/`` and each shard key's directory of the store's trees are real directories of OUT. A symbolic link
        or a file in their place is 73 naming it, before the lock: the run would read the embeddings it publishes
        (or delete) through the link, wherever it leads. A directory petal may not read is left to the reads that
        name it (66)."""
        self._check_tops()
        self._check_key_trees()

    def _check_tops(self) -> None:
        for sub in (self.versions_dir, self.store_dir):
            if sub.is_symlink() or (sub.exists() and not sub.is_dir()):
                raise OutputError(f"{quote_path(sub)} is a symlink or not a directory; petal keeps its files "
                                  f"inside {quote_path(self.root)}: remove it")

    def _check_key_trees(self) -> None:
        for tree in KEY_TREES:
            _check_key_tree(self.store_dir / tree, self.root)

    @contextlib.contextmanager
    def lock(self, wait: bool = False, on_wait: Callable[[str], None] | None = None,
             check: Callable[[], None] | None = None) -> Iterator[None]:
        """Hold the writer lock. Taken: exit 75 at once naming the holder, or with ``wait`` queue for it.

        ``check`` runs between polls while waiting (it raises to give up, e.g. on SIGTERM).
        """
        try:
            # NOTE: O_NOFOLLOW: a planted symlink must not make petal create or truncate a file elsewhere;
            # O_NONBLOCK: a FIFO planted as .lock must not block the open.
            fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _cannot_create(exc, self.lock_file, f"cannot open the lock file {quote_path(self.lock_file)}: "
                                 f"{why_no_lock(exc, self.lock_file)}") from exc
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OutputError(f"the lock file {quote_path(self.lock_file)} is not a regular file (a FIFO, a "
                                  "device?); remove it and rerun")
            shared_until: float | None = None
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError as exc:
                    shared = _held_shared_only(self.lock_file)
                    if shared:
                        shared_until = shared_until or time.monotonic() + SHARED_GRACE_S
                        if time.monotonic() < shared_until:
                            time.sleep(SHARED_RETRY_S)
                            continue
                    if not wait:
                        raise self._locked(fd, shared) from exc
                    if on_wait is not None:
                        on_wait(f"waiting for the writer lock of {quote_path(self.root)}, held by "
                                f"{self._holder(fd, shared)[0]}")
                        on_wait = None
                    if check is not None:
                        check()
                    time.sleep(LOCK_POLL_S)
            record_lock_holder(fd)
            yield
        finally:
            os.close(fd)  # releases the flock

    def check_unlocked(self) -> None:
        """Exit 75 at once naming the holder when another petal holds the writer lock: called before a run reads
        its sources (preflight may read thousands of footers, over the network), as ``lock`` would say it later.

        Creates nothing and takes no lock: ``lock`` does, after preflight. A lock file that is missing (a fresh
        OUT) or odd (a FIFO, a symlink, unreadable) is left to ``lock``, which refuses it with its own message.
        """
        try:
            fd = os.open(self.lock_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return
            try:
                # NOTE: shared: two runs probing at once do not refuse each other; released at once by the close. A
                # writer that meets this probe retries it (``lock``: SHARED_GRACE_S), it is not refused
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise self._locked(fd, shared=False) from exc
        finally:
            os.close(fd)

    def _locked(self, fd: int, shared: bool) -> TemporaryFailure:
        holder, recorded = self._holder(fd, shared)
        held = f"is being written by another petal ({holder})" if recorded else f"is locked by {holder}"
        return TemporaryFailure(f"{quote_path(self.root)} {held}; retry later, or pass --wait to queue")

    def _holder(self, fd: int, shared: bool) -> tuple[str, bool]:
        """Who holds the lock, as far as is known, and whether that is the writer recorded in ``.lock``: named only
        while it still runs (or runs on another host, where that is not known)."""
        if shared:
            return (f"another process that holds a shared lock on {quote_path(self.lock_file)} for "
                    f"{SHARED_GRACE_S:g} s or more (no petal writer: a petal that starts holds one only an instant)",
                    False)
        deadline = time.monotonic() + HOLDER_RECORD_S
        while True:
            raw = os.pread(fd, 4096, 0)
            if holder_running(raw) is not False:
                return lock_holder(raw), True
            if time.monotonic() >= deadline:
                break
            # NOTE: a writer records itself right after its flock: until then .lock names the writer before it
            time.sleep(SHARED_RETRY_S)
        return (f"a process that has not recorded itself in {quote_path(self.lock_file)} (a petal that is starting, "
                f"or another program); the holder recorded there, {lock_holder(raw)}, has exited", False)

    # --- versions -------------------------------------------------------------------------------

    def current_version(self) -> str | None:
        """The version ``CURRENT`` names (``None`` without one). Refused (78) without echoing more than
        a short escaped prefix: a pointer that is not a version id, a symlink out of OUT, a FIFO."""
        try:
            raw = read_regular(self.current_file, self.root, POINTER_MAX_BYTES)
        except FileNotFoundError as exc:
            if not os.path.islink(self.current_file):
                return None
            # NOTE: a link to nothing is not "no version published yet" (which said to wait for a run that is not
            # there): it is a pointer that names nothing, refused as one
            target = quote_text(os.readlink(self.current_file), SHOWN_POINTER_CHARS)
            raise ConfigError(f"{quote_path(self.current_file)} is a symbolic link to nothing ({target}); "
                              f"{self.recovery_hint()}") from exc
        except OSError as exc:
            if is_denied(exc):
                # NOTE: OUT itself unreadable (a chmod of the directory while serving) was blamed on CURRENT, whose
                # permissions are fine: name what petal may not read, as `petal info OUT` does
                raise denied(self.root if _denied_dir(self.root) else self.current_file) from exc
            from petal.pipeline.index.read_errors import host_os_error

            # NOTE: EIO, EMFILE, ENOMEM... are the host's (74): 78 said the output directory was damaged
            raise host_os_error(self.current_file, exc) or ConfigError(
                f"cannot read {quote_path(self.current_file)}: {exc.strerror or exc}") from exc
        name = raw.decode("utf-8", "surrogateescape").strip()
        if not VERSION_RE.match(name):
            held = (f"holds {quote_text(name, SHOWN_POINTER_CHARS)}, which is not a petal version id" if name
                    else "is empty (or only blank): it names no petal version id")
            raise ConfigError(f"{quote_path(self.current_file)} {held}; {self.recovery_hint()}")
        return name

    def recovery_hint(self, broken: str | None = None) -> str:
        """How to repair a bad pointer by hand (nothing is deleted while it is bad): the newest version other than
        ``broken`` (the one the pointer names) that passes the checks opening it makes (``opens``), with the other
        such versions to choose from, or, when none does, to rebuild."""
        try:
            present = self.versions()
        except OSError:
            present = []
        # NOTE: only versions that open are offered (newest first, at most 5): 'versions:' listed every directory,
        # the damaged live one included, as a version to point CURRENT at
        complete: list[str] = []
        for version in reversed(present):
            if len(complete) == MAX_LISTED_VERSIONS:
                break
            if version != broken and self.opens(version):
                complete.append(version)
        listed = f"complete versions, newest first: {', '.join(complete)}"
        # NOTE: without CURRENT, petal index builds from the store: only shards without a committed entry are
        # embedded. --full embeds every shard again (hours on a corpus the store holds whole), and a pointer that is
        # no version id stops it too (it reads CURRENT)
        rebuild = (f"remove {quote_path(self.current_file)} and rebuild with petal index, which reuses the "
                   "embeddings in the store (petal index --full embeds every shard again)")
        if not complete:
            return f"nothing was deleted; no other version passes the checks opening makes: {rebuild}"
        pick = complete[0]
        pointer = quote_path(self.current_file)
        # NOTE: a symbolic link CURRENT is removed first: 'echo V > CURRENT' wrote through it, leaving a stray file
        # where it pointed (under versions/: a 'damaged version' that turned store cleanup off) and the link in place
        write = f"rm {pointer} && echo {pick} > {pointer}" if os.path.islink(self.current_file) else \
            f"echo {pick} > {pointer}"
        return (f"nothing was deleted; to recover, point it at a complete version (petal rollback "
                f"{quote_path(self.root)} {pick}, or by hand: {write}; {listed}) or {rebuild}")

    def opens(self, version: str) -> bool:
        """True when ``versions/<version>`` passes the checks opening it makes before FAISS reads it
        (``check_opens``), so that a recovery hint never names a damaged version."""
        try:
            self.check_opens(version)
        except (PetalError, OSError, ValueError, KeyError, TypeError, AttributeError):
            return False
        return True

    def check_opens(self, version: str) -> Manifest:
        """``versions/<version>``'s manifest, once the version passes the checks opening it makes before FAISS reads
        it: its manifest read and typed, recording ``version`` (``check_version_name``), every listed file placed and
        checked against its records (``index.verify.check_on_open``). Raises what the first failed check raises."""
        from petal.pipeline.index.verify import check_on_open  # NOTE: it imports this module

        version_dir = self.version_dir(version)
        manifest = read_manifest(version_dir / MANIFEST_FILE, self.root)
        check_version_name(version_dir, manifest)
        check_on_open(version_dir)
        return manifest

    def version_dir(self, version: str) -> Path:
        """``versions/<version>``; refused (78) unless ``version`` is a version id and the directory
        stays inside ``versions/`` (no symlink out of the output directory)."""
        if not VERSION_RE.match(version):
            raise ConfigError(f"{quote_text(version, 40)} is not a petal version id")
        path = self.versions_dir / version
        if not inside(self.versions_dir, self.root):
            # NOTE: versions/ itself a link out of OUT: the link is what to name ('OUT/versions/V leads out of
            # OUT/versions' blamed the version, which lies where versions/ leads)
            raise ConfigError(f"{quote_path(self.versions_dir)} leads out of {quote_path(self.root)} (a symlink); "
                              "refusing to follow it (petal keeps its versions inside the output directory)")
        if path.is_symlink() and inside(path, self.versions_dir):
            # NOTE: a link within versions/ (or to itself) leads nowhere out: 'leads out of versions/' misled
            raise ConfigError(f"{quote_path(path)} is a symbolic link, not a version directory; refusing to follow "
                              "it (a version is a directory of its own under versions/)")
        if path.is_symlink() or (path.exists() and path.resolve().parent != self.versions_dir.resolve()):
            raise ConfigError(f"{quote_path(path)} leads out of {quote_path(self.versions_dir)}; refusing to follow it")
        return path

    def current_manifest(self) -> Manifest | None:
        """The live version's manifest (``None`` before the first publish); damaged: ``ConfigError``."""
        version = self.current_version()
        if version is None:
            return None
        return self.live_manifest(version)

    def live_manifest(self, version: str) -> Manifest:
        """The manifest of ``version``, the one ``CURRENT`` names. Damaged (no directory; its manifest missing, empty,
        not JSON, not a regular file, a key missing or of the wrong type): ``ConfigError`` (78) naming ``CURRENT``,
        the damage and the way back (``recovery_hint``); recording another version id: ``MislabeledVersion`` (65)."""
        version_dir = self.version_dir(version)
        if not version_dir.is_dir():
            raise ConfigError(f"{quote_path(self.current_file)} names {version}, {_not_a_version(version_dir)}; "
                              f"{self.recovery_hint(version)}")
        manifest_file = version_dir / MANIFEST_FILE
        try:
            manifest = Manifest.from_dict(manifest_data(manifest_file, self.root), quote_path(manifest_file))
        except ConfigError as exc:
            # NOTE: every way the live manifest fails to read is a damaged version with one way back, a complete
            # version: a key missing or of the wrong type got no hint (readers) or only 'rebuild' (petal index, petal
            # rebuild), where not JSON got the hint
            raise ConfigError(f"{quote_path(self.current_file)} names {version}, a damaged version: {exc}; "
                              f"{self.recovery_hint(version)}") from exc
        self.check_live_name(version, manifest)
        return manifest

    def check_live_name(self, version: str, manifest: Manifest) -> None:
        """``MislabeledVersion`` (65) naming ``CURRENT`` and the way back when the live version's ``manifest`` records
        another version id (``check_version_name``): never built on, rebuilt or queried as the version it records."""
        try:
            check_version_name(self.versions_dir / version, manifest)
        except MislabeledVersion as exc:
            # NOTE: petal index and rebuild took it for the version it records (rebuilt_from, its shards), and their
            # pruning kept it as a rollback version while it deleted the real one
            why = f"{quote_path(self.current_file)} names {version}, but {exc}; {self.recovery_hint(version)}"
            raise MislabeledVersion(exc.version_dir, exc.recorded, why) from None

    def live_is_valid(self) -> bool:
        """True when ``CURRENT`` names a version whose manifest reads and records that version id (``_complete``;
        checked before anything is deleted on the pointer's word). NOTE: a manifest that is a file was enough, and an
        unreadable one counted as valid: the versions newer than a damaged live one were deleted as leftovers, the
        good one its recovery hint named among them, and then the run refused the damaged one (78)."""
        try:
            version = self.current_version()
            return version is not None and self._complete(version)
        except (PetalError, OSError):
            return False

    def _complete(self, version: str) -> bool:
        """True when ``versions/<version>``'s manifest reads (a JSON object with every key a manifest has) and records
        ``version`` (``check_version_name``): a version a run wrote whole, or one renamed back by hand."""
        try:
            version_dir = self.version_dir(version)
            check_version_name(version_dir, read_manifest(version_dir / MANIFEST_FILE, self.root))
        except (PetalError, OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return False
        return True

    def _unfinished(self, version: str) -> bool:
        """True when ``versions/<version>`` holds no version petal wrote whole: no manifest, or one that is none (empty,
        not JSON, a key missing), or no directory. A manifest petal may not read, or an I/O error, proves nothing
        (False): such a version may be whole."""
        try:
            read_manifest(self.version_dir(version) / MANIFEST_FILE, self.root)
        except (NoInputError, PetalIOError, OSError):
            return False
        except (PetalError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
            return True
        return False

    def started_from(self) -> StartedFrom:
        """What ``CURRENT`` holds now, for a writer that has just taken the lock: its publish checks the pointer holds
        it still, right before the swap (``publish``), and removes the versions newer than its live version after
        it (``prune_versions``)."""
        return StartedFrom(current_pointer(self.root), self.current_version() if self.live_is_valid() else None)

    def mislabeled(self, version: str) -> MislabeledVersion | None:
        """Why ``versions/<version>`` holds another version (its manifest records another id: copied or renamed by
        hand, ``check_version_name``), else ``None``, also when its manifest cannot be read (what the other checks
        judge). Such a directory is no version of this OUT's: never counted as a rollback version, never deleted as
        a superseded or leftover one (it may hold the only copy of the version it records)."""
        try:
            version_dir = self.version_dir(version)
            check_version_name(version_dir, read_manifest(version_dir / MANIFEST_FILE, self.root))
        except MislabeledVersion as exc:
            return exc
        except (PetalError, OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        return None

    def versions(self) -> list[str]:
        if not self.versions_dir.is_dir():
            return []
        return sorted(p.name for p in self.versions_dir.iterdir() if VERSION_RE.match(p.name))

    def new_version_id(self) -> str:
        """A version id never handed out in OUT before, sorting after every version on disk; recorded in
        ``.last-version`` (fsynced) before it is returned, so a version published under it, or one removed later
        (never live, newer than a rolled-back live version), keeps its number to itself. Call with the lock held.

        Without a usable mark (an OUT of an older petal, the mark deleted, garbage or unreadable) the number
        follows the versions on disk, said on stderr when there are any, and the id's time stamp is taken after
        the current second has passed: a number a removed version had may come back, never its whole id. A mark
        that cannot be written is 73/74 naming it (nothing is published without it)."""
        existing = self.versions()
        on_disk = max((int(v[1:7]) for v in existing), default=0)
        last, problem = self._last_version()
        if problem is not None and (existing or os.path.lexists(self.last_version_file)):  # else a new OUT
            after = f"after the newest one on disk ({existing[-1]})" if existing else "from 1 (none on disk)"
            _note(f"{problem}; numbering the new version {after}: a removed version's number may be used again "
                  f"(with a later time stamp); {quote_path(self.last_version_file)} is written again")
            # NOTE: an id handed out earlier this second (a removed version's) must not come back whole
            _next_second()
        number = max(on_disk, last) + 1
        if number > MAX_VERSION_NUMBER:
            raise ConfigError(f"{quote_path(self.root)} has used every version number (up to v{MAX_VERSION_NUMBER}); "
                              "build the index in a new output directory")
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        version = f"v{number:06d}-{stamp}"
        self._record(version)
        return version

    def _record(self, version: str) -> None:
        """Write ``version`` to ``.last-version`` (atomic, fsynced); 73/74 naming it when that fails."""
        with writing(self.last_version_file):
            if self.last_version_file.is_dir() and not self.last_version_file.is_symlink():
                raise OutputError(f"{quote_path(self.last_version_file)} is a directory; petal records the last "
                                  "version id there: remove it")
            write_bytes_atomic(self.last_version_file, f"{version}\n".encode())

    def _cover(self, version: str) -> None:
        """Raise ``.last-version`` to ``version`` (a version on disk) when it is behind, missing or unreadable (said
        on stderr), before a version that may be the newest is removed: its number is never handed out again."""
        last, problem = self._last_version()
        if problem is None and last >= int(version[1:7]):
            return
        if problem is not None:
            _note(f"{problem}; recording {version}, the newest version on disk, there")
        self._record(version)

    def _last_version(self) -> tuple[int, str | None]:
        """The number of the last version id handed out (``.last-version``), and why it is not known (``None``:
        known; 0 with a reason: missing, unreadable or not a version id)."""
        path = self.last_version_file
        try:
            raw = read_regular(path, self.root, POINTER_MAX_BYTES)
        except FileNotFoundError:
            return 0, f"{quote_path(path)} (the last version id handed out) is missing"
        except (OSError, ConfigError) as exc:  # NOTE: UnsafeFileError (a FIFO, a link out) is a ConfigError
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else one_line(str(exc))
            return 0, f"cannot read {quote_path(path)} (the last version id handed out): {reason}"
        name = raw.decode("utf-8", "surrogateescape").strip()
        if not VERSION_RE.match(name):
            return 0, (f"{quote_path(path)} (the last version id handed out) holds "
                       f"{quote_text(name, SHOWN_POINTER_CHARS)}, which is not a version id")
        return int(name[1:7]), None

    def publish_mark(self) -> str:
        """What any publish changes: the live pointer and the last version id handed out (a rollback by hand puts the
        pointer back, not the mark). A stopped --full run is resumed only while it is the same
        (``EmbeddingStore.begin_full_run``)."""
        return f"{current_pointer(self.root) or ''}#{self._last_version()[0]}"

    def staging_dir(self) -> Path:
        path = self.versions_dir / f".staging-{uuid.uuid4().hex[:12]}"
        path.mkdir(parents=True)
        return path

    def clean_orphans(self) -> list[Path]:
        """Remove what crashed runs left: staging and half-deleted versions, the directories newer than the live
        version that hold no version (``_unfinished``), temp files of the pointer. Call with the lock held. Returns
        what was removed (``removed_versions`` names the versions among it); what cannot be removed is said in a
        warning and left (``self.left``) for the next run to try again.

        A whole version newer than the live one (CURRENT set back from it by hand, or a run killed before its pointer
        swap) is left: the run removes it once it has published (``prune_versions``), never before; a run refused,
        failed, stopped or with nothing to publish leaves it."""
        removed: list[Path] = []
        if self.versions_dir.is_dir():
            # NOTE: versions after the live one are deleted only when the pointer names a version whose manifest
            # reads: a pointer to a missing, older or damaged version must never cost the newer (possibly live) data
            live = self.current_version() if self.live_is_valid() else None
            newer = [v for v in self.versions() if live is not None and v > live]
            # NOTE: a copy made by hand is no leftover of a run: a 'mv versions/V1 versions/V9' holds V1's only copy
            copies = self._copies(newer)
            junk = [v for v in newer if v not in copies and self._unfinished(v)]
            if junk:  # NOTE: their numbers stay taken once they are gone (a mark missing or behind: raised first)
                self._cover(newer[-1])
            in_use: list[str] = []
            for path in sorted(self.versions_dir.iterdir()):
                if path.name.startswith((".staging-", ".deleting-")):
                    # NOTE: removed with ignore_errors, one petal could not delete stayed for good without a word
                    if remove_or_leave(path, _leftover_kind(path.name), self.left):
                        removed.append(path)
                elif path.name in junk:
                    with _unless_in_use(path) as free:
                        if not free:
                            in_use.append(path.name)
                        elif self._delete_version(path.name, f"{path.name}, newer than the live version {live}, "
                                                             "which holds no whole version"):
                            removed.append(path)
            gone = sorted(p.name for p in removed if p.name in junk)
            if gone:  # NOTE: never removed silently
                _note(f"removed {', '.join(gone)} (newer than the live version {live}, and no whole version: its "
                      "manifest is missing or damaged)")
            if in_use:
                _note(f"kept {', '.join(sorted(in_use))} (newer than the live version {live}): "
                      f"{_in_use_by('still serves it')}; removed by a run after that reader lets it go")
        for tmp in [*self.root.glob(".CURRENT.tmp-*"), *self.root.glob(f".{LAST_VERSION_FILE}.tmp-*"),
                    *self.root.glob(f".{PRUNING_FILE}.tmp-*"),
                    *self.root.glob(".write-probe-*"),
                    *self.root.glob(".rejects.parquet.tmp-*")]:
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
        return removed

    def removed_versions(self, removed: list[Path]) -> list[str]:
        """The versions among ``removed`` (``clean_orphans``'s: those newer than the live version), for the report's
        ``pruned.versions``."""
        return sorted(p.name for p in removed if p.parent == self.versions_dir and not p.name.startswith("."))

    def _first_kept(self, older: list[str], rollbacks: int) -> int:
        """Where the ``rollbacks`` newest of ``older`` (sorted) that a rollback could go to begin: a version whose
        manifest cannot be read is none, so it is not counted (it took the place of a good one, which was deleted
        in its stead); such a version newer than that is kept, one older goes with the rest."""
        if rollbacks <= 0:
            return len(older)
        counted = 0
        for i in range(len(older) - 1, -1, -1):
            if self._readable(older[i]):
                counted += 1
                if counted == rollbacks:
                    return i
        return 0

    def _readable(self, version: str) -> bool:
        try:
            read_manifest(self.version_dir(version) / MANIFEST_FILE, self.root)
        except (PetalError, OSError, ValueError, KeyError, TypeError, AttributeError):
            if version not in self._copies_said:
                _note(f"version {version}'s manifest cannot be read: not counted as a rollback version")
                self._copies_said.add(version)
            return False
        return True

    def _copies(self, versions: list[str]) -> set[str]:
        """Those of ``versions`` that hold another version (``mislabeled``), each said on stderr: kept on disk, never
        counted as a rollback version nor removed (the user renames or removes them)."""
        copies = set()
        for version in versions:
            why = self.mislabeled(version)
            if why is None:
                continue
            if version not in self._copies_said:
                _note(f"{why}; kept it: not counted as a rollback version and not removed (remove it, or rename it "
                      "under a name that is no version id, by hand)")
                self._copies_said.add(version)
            copies.add(version)
        return copies

    def publish(self, staging: Path, version: str, keep_versions: int | None = None,
                started: StartedFrom | None = None) -> Path:
        """Make a fully written staging directory the live version (atomic for readers).

        Every file and the directory are fsynced, the directory renamed to ``versions/<version>``,
        then ``CURRENT`` replaced in one ``os.replace``; an I/O error on the way exits 74 with the
        live version untouched. ``keep_versions``: the pruning the publish owes, recorded in ``.pruning`` before the
        swap (``prune_versions`` removes it once done; else the next run finishes it: ``finish_pruning``), with
        ``started.version`` (the versions newer than it go too).

        ``started``: what ``CURRENT`` held when the run took the lock. Checked before the rename and again right
        before the ``os.replace`` of the pointer: changed (a rollback by hand during the run), nothing is published,
        the version is removed and ``TemporaryFailure`` (75) names both.
        """
        final = self.version_dir(version)
        self._check_unchanged(started)
        with writing(staging):
            for f in staging.iterdir():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            fsync_dir(staging)
            fault("before_version_rename", final)
            os.replace(staging, final)
            fsync_dir(self.versions_dir)
        try:
            if keep_versions is not None:  # NOTE: before the swap: a run killed right after it still owes its pruning
                newer = self._newer_owed(self._owed_pruning(), started.version if started is not None else None)
                owed = {"version": version, "keep_versions": keep_versions,
                        **({"since": started.version} if started is not None and started.version else {}),
                        **({"newer": newer} if newer else {})}
                with writing(self.pruning_file):
                    write_bytes_atomic(self.pruning_file, json.dumps(owed).encode())
            self.set_live(version, started)
        except BaseException:
            if current_pointer(self.root) != version:  # never live: free its space now (a full disk)
                shutil.rmtree(final, ignore_errors=True)
            raise
        return final

    def set_live(self, version: str, started: StartedFrom | None) -> None:
        """Make ``version`` the live one: ``CURRENT`` replaced in one ``os.replace`` (written and fsynced beside it
        first), so that a reader sees the old pointer or the new one, never a part. The publish and ``petal rollback``
        both swap it here, with the writer lock held. ``started``: as ``publish``'s (75 when ``CURRENT`` changed)."""
        with writing(self.current_file):
            fault("before_current_swap", self.current_file)
            # NOTE: checked once the new pointer is written and fsynced, right before the rename: the window
            # an 'echo vOLD > CURRENT' can still fall in is the rename itself (nothing locks a shell's write)
            write_bytes_atomic(self.current_file, f"{version}\n".encode(), lambda: self._check_unchanged(started))

    def _check_unchanged(self, started: StartedFrom | None) -> None:
        """``TemporaryFailure`` (75) when ``CURRENT`` no longer holds what it held when the run took the lock (set by
        hand meanwhile: a rollback the publish would overwrite, whose version its pruning could then remove)."""
        if started is None:
            return
        now = current_pointer(self.root)
        if now != started.pointer:
            raise TemporaryFailure(f"{quote_path(self.current_file)} changed during the run ({_shown(started.pointer)}"
                                   f" -> {_shown(now)}, set by hand?): nothing published; run again")

    def prune_versions(self, keep: int, in_use: list[str] | None = None, stopping: Callable[[], bool] | None = None,
                       why: str | None = None, published: str | None = None, since: str | None = None) -> list[str]:
        """Delete all but the live version and the ``keep - 1`` versions before it (rollback targets); returns
        the versions deleted, which are named in a note on stderr (``why``: what asked for it, ``--keep-versions K``
        by default). ``stopping``: true once a stop signal came (the rest is left to the next run). Call after a
        publish only, or to finish the pruning one owes (``finish_pruning``): a run that publishes nothing prunes
        none by its own ``--keep-versions`` (README). Once every version it would delete is gone, the pruning a
        publish owes (``.pruning``) is done.

        ``published``: the version the publish made live; ``CURRENT`` naming another now (set by hand since), nothing
        is pruned. ``since``: the live version the publishing run started from (``StartedFrom.version``): the
        versions between it and the live one go first, and are not counted among the ``keep - 1`` (CURRENT was set
        back from them by hand, or a run killed before its pointer swap left them: a run removes them only once it
        has published, so a refused or failed one leaves every version on disk).

        A version a reader holds open (``VersionLease``: the one a ``petal serve`` serves, which may be an older
        one when it refused the live one) is kept: named on stderr and appended to ``in_use``; a run after the reader
        lets it go removes it (the pruning is owed still: ``finish_pruning``). A version is renamed to
        ``.deleting-*`` before it is deleted, so a crash midway never leaves a half-deleted directory under a version
        name; one that cannot be deleted whole is not among those returned: a warning names what is left and why
        (``self.left``), and the next run's ``clean_orphans`` tries again.
        """
        live = self.current_version() if self.live_is_valid() else None
        if live is None:
            return []
        if published is not None and live != published:
            _note(f"{quote_path(self.current_file)} names {live}, not {published} that was published (set by hand "
                  "since?): no version pruned")
            return []
        # NOTE: the run removes them only now, once it has published: at its start, one refused (settings drift, a
        # 65 check), failed or with nothing to do deleted the newest versions, the way forward from a rollback by hand
        owed = set(self._newer_owed(self._owed_pruning(), live))
        between = [v for v in self.versions() if (since is not None and since < v < live) or v in owed]
        between = [v for v in between if v not in self._copies(between)]
        newer_gone, newer_kept = self._remove_newer(between, since, live, stopping, in_use)
        older = [v for v in self.versions() if v < live and v not in between]
        copies = self._copies(older)  # NOTE: counted, they took the place of the real versions they copy
        older = [v for v in older if v not in copies]
        doomed = older[: self._first_kept(older, keep - 1)] if keep >= 1 else []
        removed, kept, stopped = self._delete_each(doomed, f"which --keep-versions {keep} prunes", stopping)
        if stopped:
            return newer_gone + self._pruned(removed, kept, keep, in_use, why)
        remaining = set(self.versions())  # NOTE: listed once, not once a doomed version
        if not kept and not newer_kept and remaining.isdisjoint([*doomed, *between]):  # else it is owed still
            self.pruning_file.unlink(missing_ok=True)
        return newer_gone + self._pruned(removed, kept, keep, in_use, why)

    def _remove_newer(self, newer: list[str], since: str | None, live: str, stopping: Callable[[], bool] | None,
                      in_use: list[str] | None) -> tuple[list[str], list[str]]:
        """Delete ``newer``: the versions between ``since`` (the live version a run started from) and ``live`` (the
        one it published), and those an earlier publish's pruning owed the same way (newer than the version CURRENT
        was set back to by hand), each said; one a reader holds is kept (said, appended to ``in_use``). Returns
        (removed, kept)."""
        removed, kept, _ = self._delete_each(newer, "which CURRENT was set back from", stopping)
        # NOTE: a version an earlier publish owed may be older than ``since`` (rolled back past, then a publish cut
        # short): "newer than the live version the run started from" would be wrong of it
        over = f"the live version {since} that {live} was published over" if since is not None and \
            all(since < v for v in newer) else f"the version CURRENT was set back to before {live} was published"
        if removed:  # NOTE: a whole version, possibly live before CURRENT was set back: never removed silently
            _note(f"removed {', '.join(removed)} (newer than {over}: CURRENT was set back from {_it(removed)} by hand, "
                  f"or a stopped run never made {_it(removed)} live)")
        if kept:
            _note(f"kept {', '.join(kept)} (newer than {over}): {_in_use_by('still serves it')}; removed by a run "
                  "after that reader lets it go")
            if in_use is not None:
                in_use.extend(kept)
        return removed, kept

    def _delete_each(self, versions: list[str], why: str,
                     stopping: Callable[[], bool] | None) -> tuple[list[str], list[str], bool]:
        """Delete each of ``versions`` (``_delete_version``; ``why``: what removes it, for a warning) but one a reader
        holds. Returns (removed, kept, stopped: a stop signal came before all were tried)."""
        removed: list[str] = []
        kept: list[str] = []
        for version in versions:
            if stopping is not None and stopping():
                return removed, kept, True
            with _unless_in_use(self.versions_dir / version) as free:
                if not free:
                    kept.append(version)
                # NOTE: under the exclusive lock: no lease taken meanwhile. One that cannot be deleted whole is said
                # and left (it was reported as pruned and stayed as .deleting-* for good, without a word)
                elif self._delete_version(version, f"the version {version}, {why}"):
                    removed.append(version)
        return removed, kept, False

    def _pruned(self, removed: list[str], kept: list[str], keep: int, in_use: list[str] | None,
                why: str | None) -> list[str]:
        """Say what ``prune_versions`` removed and kept (``in_use`` gets the kept ones); returns ``removed``."""
        if removed:
            _note(f"removed {_count(len(removed), 'old version')} ({why or f'--keep-versions {keep}'}): "
                  f"{', '.join(removed)}")
        if kept:
            # NOTE: named every reader that leases a version: it said only 'a petal serve ... having refused the live
            # version?', which sent an operator after a server when a Python program's open Index held it
            _note(f"kept {', '.join(kept)}, which --keep-versions would remove: "
                  f"{_in_use_by('is still on it (it leaves it once it follows the new version)')}; removed by a "
                  "run after that reader lets it go")  # NOTE: said the server 'refused the live version' when it
            # had only not swapped yet (it follows CURRENT a moment later)
            if in_use is not None:
                in_use.extend(kept)
        return removed

    def finish_pruning(self, in_use: list[str] | None = None, stopping: Callable[[], bool] | None = None) -> list[str]:
        """For a run that publishes nothing: finish the pruning the live version's publish owes (``.pruning``: a crash,
        a stop signal or a reader's lease cut it short), with that run's ``--keep-versions``, never this run's, and
        the versions newer than the live version that run started from; as ``prune_versions``. A record of a version
        that is not the live one (never made live, or CURRENT set back by hand since) is dropped."""
        owed = self._owed_pruning()
        if owed is None:
            return []
        live = self.current_version() if self.live_is_valid() else None
        if owed.version != live:
            # NOTE: a publish over the live version that never went live carried on what the live one's pruning owed
            # of the versions newer than its rollback target (``_newer_owed``): those go, the record then
            newer = self._newer_owed(owed, live)
            newer = [v for v in newer if v not in self._copies(newer)]
            removed, kept = self._remove_newer(newer, None, live, stopping, in_use) if newer and live else ([], [])
            if not kept and not (stopping is not None and stopping()):
                self.pruning_file.unlink(missing_ok=True)
            return removed
        why = (f"--keep-versions {owed.keep_versions} of the run that published {owed.version}, whose pruning was cut "
               "short")
        return self.prune_versions(owed.keep_versions, in_use, stopping, why, owed.version, owed.since)

    def _newer_owed(self, owed: OwedPruning | None, live: str | None) -> list[str]:
        """The versions newer than a rollback target that ``owed`` holds for ``live``: of ``live``'s own publish, those
        between its starting version and ``live`` and those it carries (``newer``); of a publish over ``live`` that
        never went live (killed or refused before its swap), those it carries. The next publish's record carries
        them on.

        NOTE: a publish replaces the record: the versions the user had set CURRENT back from, which a run killed in
        its pruning owed, were then counted as rollback targets, and the version rolled back to was pruned instead."""
        if owed is None or live is None:
            return []
        if owed.version != live:
            return [v for v in self.versions() if v in owed.newer and v < live] if owed.since == live else []
        return [v for v in self.versions() if (owed.since is not None and owed.since < v < live) or v in owed.newer]

    def _owed_pruning(self) -> OwedPruning | None:
        """``.pruning``'s record, ``None`` without one; one that is not such a record is said and removed (a ``newer``
        that is no list of version ids is taken as none)."""
        try:
            data = json.loads(read_regular(self.pruning_file, self.root, PRUNING_MAX_BYTES))
            version, keep, since = data["version"], data["keep_versions"], data.get("since")
            if VERSION_RE.match(version) and isinstance(keep, int) and not isinstance(keep, bool) and keep >= 1 \
                    and (since is None or (isinstance(since, str) and VERSION_RE.match(since) and since < version)):
                newer = data.get("newer", [])
                newer = newer if isinstance(newer, list) else []
                return OwedPruning(version, keep, since, tuple(v for v in newer if isinstance(v, str)
                                                               and VERSION_RE.match(v) and v < version))
        except FileNotFoundError:
            return None
        except (OSError, PetalError, ValueError, KeyError, TypeError, RecursionError):
            pass
        _note(f"{quote_path(self.pruning_file)} is no record of a pruning petal owes; removed it")
        self.pruning_file.unlink(missing_ok=True)
        return None

    def _delete_version(self, version: str, what: str) -> bool:
        """Delete ``versions/<version>``: renamed to ``.deleting-<version>`` first, so that a crash or a failure midway
        never leaves a half-deleted directory under a version name. True once it is gone; else it is said and left
        (``self.left``) for the next run's clean-up to try again."""
        path, trash = self.versions_dir / version, self.versions_dir / f".deleting-{version}"
        try:
            fault("version_prune", path)  # NOTE: per version: an error here ended the whole clean-up, the path unnamed
            os.replace(path, trash)
        except OSError as exc:
            leave(path, what, f"cannot rename it to {trash.name}: {exc.strerror or exc}", self.left)
            return False
        return remove_or_leave(trash, what, self.left)


class VersionLease:
    """A reader's hold on a published version, so that pruning leaves it on disk: a shared ``flock`` on the
    version's ``manifest.json``, held until ``release()`` (``petal serve``: until the version it served is
    replaced and its last request has finished).

    The kernel drops the lock when the descriptor is closed or the process dies, kill -9 included: a dead
    reader never pins a version. Nothing is written (OUT may be mounted read-only). A writer about to delete a
    version takes an exclusive lock without waiting (``_unless_in_use``) and keeps the version when it cannot.

    Taken on a version that is gone or being deleted: ``FileNotFoundError``. On a filesystem without locks
    (``held`` False, ``why`` says what failed) nothing protects the version, as before leases.
    """

    def __init__(self, version_dir: Path) -> None:
        self.version_dir = Path(version_dir)
        self.why: str | None = None  # why none is held (held False)
        self._fd: int | None = None
        path = self.version_dir / MANIFEST_FILE
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise
        except OSError as exc:  # a symlink (ELOOP), ...: pruning cannot lock it either (_unless_in_use)
            self.why = f"cannot open {quote_path(path)} to lock it: {exc.strerror or exc}"
            return
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode):
                raise FileNotFoundError(errno.ENOENT, "not a regular file", str(path))
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError as exc:  # a writer holds it exclusively: deleting it right now
                raise FileNotFoundError(errno.ENOENT, "the version is being deleted", str(path)) from exc
            except OSError as exc:  # no locks on this filesystem (ENOLCK...): pruning cannot tell either
                self.why = f"cannot lock {quote_path(path)}: {exc.strerror or exc}"
                os.close(fd)
                return
            now = os.stat(path, follow_symlinks=False)  # NOTE: deleted between the open and the lock: gone
            if (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino):
                raise FileNotFoundError(errno.ENOENT, "the version was deleted", str(path))
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Let the version go (again: a no-op)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # releases the flock

    def __enter__(self) -> VersionLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def _unless_in_use(version_dir: Path) -> Iterator[bool]:
    """Yields whether ``version_dir`` may be deleted: True while holding the exclusive lock of its manifest (a
    reader's ``VersionLease`` cannot start until the deletion is done), False when a reader holds a lease.

    A version without a regular manifest cannot be leased (True). A filesystem without locks: True, as before
    leases (no reader can hold one there either)."""
    path = version_dir / MANIFEST_FILE
    fd = None
    # NOTE: read-write first: NFS emulates flock with POSIX locks, whose exclusive lock needs a writable descriptor
    for flags in (os.O_RDWR, os.O_RDONLY):
        try:
            fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            break
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR):
                break  # gone, a symlink, ...: nothing a reader can lease
    if fd is None:
        yield True
        return
    try:
        free = True
        if stat.S_ISREG(os.fstat(fd).st_mode):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                free = False
            except OSError:  # no locks on this filesystem: no lease either
                pass
        yield free
    finally:
        os.close(fd)


# A write that fails for the disk, not for what OUT is: full (blocks or inodes), over quota, failing
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO)


def _cannot_create(exc: OSError, path: Path, message: str) -> PetalError:
    """``message``, cannot create output (73), for an OUT petal may not use as it is; a full or failing disk
    (``DISK_ERRNOS``) is 74 naming the path, as every later write of the run says it (``errors.writing``)."""
    if exc.errno in DISK_ERRNOS:
        return PetalIOError(f"cannot write {quote_path(exc.filename or path)}: {exc.strerror or exc}")
    return OutputError(message)


def _check_key_tree(tree: Path, root: Path) -> None:
    """A tree of the store that holds one directory per shard key (``store/shards``, ``parts``, ``deleted``,
    ``columns``) holds real directories only: a symbolic link or a file there is 73 naming it, before the lock. A run
    would write through a link or delete what its target holds, wherever that is (petal never follows one out of
    OUT), and never deletes it itself: it is not petal's. One petal may not list is left to the checks that name it."""
    try:
        if not os.path.lexists(tree):
            return
        if tree.is_symlink() or not tree.is_dir():
            raise OutputError(f"{quote_path(tree)} is a symlink or not a directory; petal keeps its store inside "
                              f"{quote_path(root)}: remove it")
        with os.scandir(tree) as found:
            odd = sorted(Path(e.path) for e in found if not e.is_dir(follow_symlinks=False))
    except OSError:
        return
    if odd:
        kind = "a symbolic link" if odd[0].is_symlink() else "not a directory"
        more = f" (and {len(odd) - 1} more)" if len(odd) > 1 else ""
        raise OutputError(f"{quote_path(odd[0])}{more} is {kind}, where petal keeps a directory of its store (one per "
                          "shard key); petal never follows a link out of the output directory: remove it")


def _check_usable(path: Path) -> None:
    """A directory of OUT (there, a directory) that this process may list, enter and write (the kernel asked for the
    effective ids: root without CAP_DAC_OVERRIDE is refused like anyone); else 73 naming it."""
    if not path.is_dir() or path.is_symlink():
        return  # NOTE: missing (created later) or refused by prepare's own check
    effective = os.access in os.supports_effective_ids
    if not os.access(path, os.R_OK | os.X_OK, effective_ids=effective):
        raise OutputError(f"cannot create output: petal may not read {quote_path(path)} (permission denied); "
                          "run as a user who may read and write it, or fix its permissions")
    if not os.access(path, os.W_OK, effective_ids=effective):
        # NOTE: a directory of OUT mounted read-only (a bind mount of OUT/versions) is EROFS, which no permission
        # cures: named as that, as OUT itself is (check_output_dir), never as "permission denied"
        if why_not_writable(path) == READ_ONLY:
            raise OutputError(f"cannot create output: petal may not write {quote_path(path)} ({READ_ONLY}); remount "
                              "it read-write, or give another --out")
        raise OutputError(f"cannot create output: petal may not write {quote_path(path)} (permission denied); "
                          "run as a user who may read and write it, or fix its permissions")


def _next_second() -> None:
    """Wait until the UTC second (a version id's time stamp) is past the one of the call."""
    now = time.time()
    time.sleep(max(0.0, int(now) + 1 - now))


def _note(message: str) -> None:
    say(f"note: {message}")


def _in_use_by(serve: str) -> str:
    """Why a version pruning would remove is kept: every kind of reader that leases one (``VersionLease``), the
    petal serve one as ``serve`` says (``is still on it``: an older version; ``still serves it``: a
    newer one, live before CURRENT was set back by hand)."""
    return ("in use by a reader (a petal.Index still open on it, petal query --stdin, petal verify or info reading it, "
            f"or a petal serve that {serve})")


def _it(names: list[str]) -> str:
    return "it" if len(names) == 1 else "them"


def _shown(pointer: str | None) -> str:
    """What ``CURRENT`` held, for a message: a version id as it is, anything else quoted and cut, none said."""
    if pointer is None:
        return "none"
    return pointer if VERSION_RE.match(pointer) else quote_text(pointer, SHOWN_POINTER_CHARS)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _leftover_kind(name: str) -> str:
    """What a dot-directory of ``versions/`` a clean-up removes is, for a warning that cannot remove it."""
    if name.startswith(".deleting-"):
        return f"what is left of the deleted version {name[len('.deleting-'):]}"
    return "the staging directory of a run that stopped or failed"


def is_denied(exc: BaseException) -> bool:
    """Permission denied (EACCES, EPERM): neither a transient I/O error nor damage."""
    return isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM)


def denied(path: object) -> NoInputError:
    """A file or directory of an index this process may not read: no input (66) naming it, as a source petal may
    not read is; not 74 (a retry fails the same way) nor 78 (a damaged version: nothing is wrong with it)."""
    return NoInputError(f"{quote_path(path)}: petal may not read it (permission denied); run as a user who may "
                        "read the index, or fix its permissions")


def _denied_dir(path: Path) -> bool:
    """Whether listing the directory ``path`` is refused (permission denied)."""
    try:
        os.listdir(path)
    except OSError as exc:
        return is_denied(exc)
    return False


def _not_a_version(version_dir: Path) -> str:
    """Why the version directory ``CURRENT`` names is not one: gone, or something else under its name.
    NOTE: 'which is not in versions/' for a file of that name (``ls versions`` shows it) misled."""
    if not os.path.lexists(version_dir):
        return f"which is not in {quote_path(version_dir.parent)}"
    kind = "a symbolic link to nothing" if version_dir.is_symlink() and not version_dir.exists() else \
        "a file, not a directory" if version_dir.is_file() else "not a directory"
    return f"but {quote_path(version_dir)} is {kind}"


def not_an_index(path: Path) -> ConfigError:
    """78 for a path that holds no petal index (missing, a plain file, a directory without ``CURRENT``): one wording
    for every command that reads one (``query``, ``info``, ``verify``, ``rebuild``, ``serve``). An output directory
    a first ``petal index`` run has begun (its lock file, store or versions) but not yet published into is said so:
    'not a petal index; build one' misled while that run was still embedding."""
    path = Path(path)
    try:
        begun = not (path / "CURRENT").exists() and any(
            (path / name).exists() for name in (".lock", "store", "versions"))
    except OSError:
        begun = False
    if begun:
        return ConfigError(f"{quote_path(path)} holds no published version yet: a petal index run into it has not "
                           "published one (it may still be running, or it stopped before publishing); wait for it "
                           "to finish, or run petal index again")
    return ConfigError(f"{quote_path(path)} is not a petal index (no CURRENT or manifest.json); build one with "
                       "petal index")


def resolve_index_dir(path: Path) -> tuple[Path, Manifest]:
    """A version directory and its manifest, from ``OUT`` (follows CURRENT) or a version directory."""
    path = Path(path)
    for place in (path, path / "versions"):
        try:
            os.listdir(place)
        except OSError as exc:
            if is_denied(exc):
                raise denied(place) from exc
    if (path / MANIFEST_FILE).exists() or (path / MANIFEST_FILE).is_symlink():
        manifest = read_manifest(path / MANIFEST_FILE, path)
        check_version_name(path, manifest)
        return path, manifest
    out = OutputDir(path)
    version = out.current_version() if path.is_dir() else None
    if version is None:
        raise not_an_index(path)
    # NOTE: the version its manifest records was served, queried and verified under CURRENT's name (a version
    # directory copied or renamed: v3 holding v2's index): live_manifest refuses it
    return out.version_dir(version), out.live_manifest(version)


class MislabeledVersion(BadInputError):
    """A version directory whose manifest records another version id (65): copied or renamed by hand. A version id
    names one index for the life of OUT, so it is never taken for the one its manifest names."""

    def __init__(self, version_dir: Path, recorded: str, message: str) -> None:
        super().__init__(message)
        self.version_dir = version_dir
        self.recorded = recorded


def check_version_name(version_dir: Path, manifest: Manifest) -> None:
    """``MislabeledVersion`` (65) when ``version_dir`` is named as a version id (a directory of ``versions/``, or one
    copied out under its name) and its manifest records another; a directory of another name (a version copied to
    ``/srv/index``) is not compared."""
    name = Path(version_dir).name
    if VERSION_RE.match(name) and manifest.version != name:
        why = _mislabeled(version_dir, manifest.version)
        raise MislabeledVersion(Path(version_dir), manifest.version, why)


def _mislabeled(version_dir: Path, recorded: str) -> str:
    """Why a version directory whose manifest records ``recorded`` is refused, naming the file and both ids."""
    return (f"{quote_path(Path(version_dir) / MANIFEST_FILE)} records version {quote_text(recorded, 40)}, not "
            f"{Path(version_dir).name} (its directory's name): the directory was copied or renamed, and a version id "
            "names one index; refusing to take it for either version")


def current_pointer(path: Path) -> str | None:
    """The version name ``path/CURRENT`` holds now (``None`` for a version directory, no pointer or an empty one).

    NOTE: never through a symlink out of ``path``, never from a FIFO (it would block the reader for good), at most
    256 bytes."""
    try:
        return read_regular(Path(path) / "CURRENT", Path(path), 256).decode("utf-8", "replace").strip() or None
    except (OSError, PetalError):
        return None


def read_manifest(manifest_file: Path, root: Path) -> Manifest:
    """A version's manifest, read inside ``root`` (never a FIFO or a symlink out); anything else is a
    ``ConfigError`` (78)."""
    try:
        data = manifest_data(manifest_file, root)
    except UnsafeFileError:
        raise
    except ConfigError as exc:
        raise ConfigError(f"{exc}; the version is damaged: rebuild it with petal index (--full if it is the live "
                          "one)") from exc
    return Manifest.from_dict(data, quote_path(manifest_file))


def manifest_data(manifest_file: Path, root: Path) -> dict[str, Any]:
    """A manifest's JSON object, read inside ``root`` (never a FIFO or a symlink out); missing, empty, not JSON
    or not an object: a ``ConfigError`` (78) saying which, without advice (the caller knows the way back)."""
    try:
        raw = read_regular(manifest_file, root, MANIFEST_MAX_BYTES)
        data = json.loads(raw) if raw.strip() else None
    except RecursionError as exc:  # NOTE: '[[[[...' past Python's recursion limit: a traceback in every command
        raise ConfigError(f"cannot read the manifest {quote_path(manifest_file)} (JSON nested too deeply)") from exc
    except (OSError, ValueError) as exc:  # NOTE: JSONDecodeError and UnicodeDecodeError are ValueErrors
        if is_denied(exc):
            raise denied(manifest_file if os.access(manifest_file.parent, os.X_OK) else manifest_file.parent) from exc
        if isinstance(exc, OSError):
            from petal.pipeline.index.read_errors import host_os_error

            # NOTE: EIO, EMFILE, ENOMEM... are the host's (74), not a damaged version to roll back from (78)
            failed = host_os_error(manifest_file, exc)
            if failed is not None:
                raise failed from exc
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigError(f"cannot read the manifest {quote_path(manifest_file)} ({reason})") from exc
    if data is None:
        raise ConfigError(f"cannot read the manifest {quote_path(manifest_file)} (empty)")
    if not isinstance(data, dict):
        raise ConfigError(f"the manifest {quote_path(manifest_file)} is not a JSON object")
    return data


def why_no_lock(exc: OSError, path: Path) -> str:
    """Why the lock file ``path`` could not be opened for writing (or created) with ``exc``, and what to do: something
    not a regular file in its place (a directory, a symlink, a FIFO...) is to be removed; permission denied is fixed
    with permissions, a read-only file system by remounting. NOTE: every error got 'it must be a regular file: remove
    it', permission denied on a plain file too."""
    reason = exc.strerror or str(exc)
    try:
        mode: int | None = os.lstat(path).st_mode
    except OSError:
        mode = None  # missing (to be created), or a directory on the way that petal may not search
    if mode is not None and not stat.S_ISREG(mode):
        kind = KINDS.get(stat.S_IFMT(mode), "something else")
        return f"it is {kind}, not a regular file; remove it"  # NOTE: its errno ('Too many levels...') misleads
    if is_denied(exc):
        if mode is None:
            return (f"{reason}; petal may not create it in {quote_path(path.parent)}: run as a user who may write "
                    "there, or fix its permissions")
        return f"{reason}; petal may not write it: run as a user who may read and write it, or fix its permissions"
    if exc.errno == errno.EROFS:
        return f"{reason}; remount it read-write, or give another output directory"
    return reason


def record_lock_holder(fd: int, **extra: str) -> None:
    """Write this process as the holder of the lock file open at ``fd`` (pid, host, start, ``extra``): what
    ``lock_holder`` shows a process the lock refuses."""
    info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), **extra,
                       "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})
    os.ftruncate(fd, 0)
    os.pwrite(fd, info.encode(), 0)


def _held_shared_only(path: Path) -> bool:
    """True when the lock file at ``path`` takes a shared lock now: whoever holds it holds it shared (no writer)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True  # NOTE: released by the close below, before the writer tries again
    except OSError:
        return False
    finally:
        os.close(fd)


def holder_running(raw: bytes) -> bool | None:
    """Whether the holder recorded in ``.lock`` still runs: ``None`` when that is not known here (no record, or a
    process of another host)."""
    try:
        info = json.loads(raw)
        pid, host = int(info["pid"]), str(info["host"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if host != socket.gethostname():
        return None
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: it runs, as another user
    try:  # NOTE: a zombie (exited, not yet reaped by its parent) holds no lock
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def lock_holder(raw: bytes) -> str:
    """The lock holder recorded in ``.lock`` (pid, host, start), one short escaped line."""
    try:
        info = json.loads(raw)
        # NOTE: re-encoded (escaped, bounded) rather than echoed: the file may have been planted
        return json.dumps({"pid": int(info["pid"]), "host": str(info["host"])[:64],
                           "started": str(info["started"])[:32]})
    except (ValueError, KeyError, TypeError, RecursionError):
        return quote_text(raw.decode("utf-8", "surrogateescape").strip(), 80) if raw.strip() else "unknown holder"
