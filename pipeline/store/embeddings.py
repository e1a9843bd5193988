"""The embedding store: one committed entry per input shard, keyed by what shaped its vectors.

```
OUT/store/shards/<shard key>/<fingerprint>/   a committed entry (never modified after commit)
    embeddings.npy   float32 [num_rows, dim]; rows that were not embedded are zero
    rows.parquet     row int64, id (the embedded rows, ascending); a range's part (store/ranges.py) also tokens int32
                     and truncated bool (each row's)
    rejects.parquet  row int64, reason string; a range's part also id (the id a row rejected after the read checks
                     had taken: empty to the tokenizer, a non-finite vector; else null) and truncated bool
    entry.json       the shard's identity (path, size, mtime, sha256), settings, counts, the sha256 of the files above
OUT/store/tmp/                                entries being written (removed at the next run)
```

The fingerprint hashes the shard's content and every setting that shapes its vectors (model
weights and tokenizer hashes, pooling, normalisation, max length, dim, dtype, columns). An entry is
written under ``tmp/`` and made visible by one ``os.replace``, so a crash never leaves a partial
entry: a rerun re-embeds exactly the shards without a committed entry.

An entry a run would build a version from (``lookup``, a committed range) is checked against the sha256 of its files
recorded in ``entry.json`` (``checksums``): vectors changed on disk since the commit (bit rot, a bad copy, an edit) are
a damaged entry, embedded again (``petal rebuild``: 65 naming it), never mixed into a new version. A run with nothing
to publish reads no entry's vectors, nor does a run read a kept shard's (an additive run's) before its build: it
hashes only the files whose stat (size, mtime, ctime, inode: ``stat``) is no longer the recorded one
(``lookup(verify=False)``); the build hashes such an entry's vectors as it reads them (``VectorReader``: 65 naming
it, nothing published). A file hashed whole and found intact under a new stat (a store copied or restored) has that
stat recorded, so later runs skip it again. An entry of an older petal, without the record, is trusted as before.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import mmap
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.index.checksums import sha256_file
from petal.pipeline.ingest.parquet import ShardInfo, integer_ids, no_ids
from petal.pipeline.layout import denied, is_denied
from petal.pipeline.reliability.durable import fsync_dir, write_json_atomic
from petal.pipeline.reliability.errors import (
    BadInputError,
    NoInputError,
    OutputError,
    PetalError,
    PetalIOError,
    TemporaryFailure,
    one_line,
    quote_path,
    writing,
)
from petal.pipeline.reliability.faults import fault
from petal.pipeline.reliability.leftovers import leave, remove_or_leave
from petal.pipeline.reliability.notes import say
from petal.pipeline.reliability.safe_files import check_regular, open_regular, read_regular
from petal.pipeline.store.side_files import real_dirs

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from petal.pipeline.store.outputs import OutputTransform
    from petal.pipeline.store.ranges import RowRange

STORE_FORMAT = 1
CHECKSUMS_KEY = "checksums"  # entry.json: {file name: sha256} of DATA_FILES, taken at the commit
STAT_KEY = "stat"  # entry.json: {file name: [size, mtime_ns, ctime_ns, inode]} of DATA_FILES at the commit
DATA_FILES = ("embeddings.npy", "rows.parquet", "rejects.parquet")
ID_PREFIX_KEY = "id_prefix"  # entry.json: the <shard> of its '<shard>:<row>' ids; null for an id column's (path_ids.py)
FULL_RUN_FILE = "full-run.json"  # OUT/store/: the --full run not yet published (EmbeddingStore.begin_full_run)
FULL_RUN_KEY = "full_run"  # entry.json: the token of the --full run that committed it
ENTRY_MAX_BYTES = 16 << 20
RACY_NS = 2_000_000_000  # a file changed this close to its hashing may change again unseen: never cached
PYARROW_PATH = re.compile(r"local file '(.+?)'")  # pyarrow's OSError carries no filename: its message quotes it


def warn(message: str) -> None:
    say(f"warning: {message}")


class DamagedEntry(Exception):
    """A store entry whose files are missing, truncated, garbage or not regular files; ``name``: the file of the entry
    being checked when ``cause`` was raised (``damage_reason``)."""

    def __init__(self, path: Path, cause: BaseException, name: str | None = None) -> None:
        self.path = path
        self.reason = damage_reason(path, cause, name)
        super().__init__(f"the store entry {quote_path(path)} is damaged ({self.reason})")


def damage_reason(path: Path, cause: BaseException, name: str | None = None) -> str:
    """Why the entry at ``path`` is damaged, naming its file: the one an OS error names (relative to the entry), else
    ``name``. NOTE: the error's text alone said 'damaged (No such file or directory)' or 'damaged (Expecting value:
    line 1 column 1 (char 0))', naming no file of the entry."""
    filename = getattr(cause, "filename", None) if isinstance(cause, OSError) else None
    if filename:
        file = Path(os.fsdecode(filename))
        name = file.relative_to(path).as_posix() if path in file.parents else quote_path(file)
    if isinstance(cause, FileNotFoundError) and name:
        return f"{name} is missing"
    reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else one_line(str(cause))[:200]
    return f"{name}: {reason}" if name and name not in reason else reason


def _entry_json(raw: bytes) -> Any:
    """An ``entry.json``'s content; ``ValueError`` when it is not JSON, its bytes not UTF-8, or it is nested past
    Python's recursion limit.

    NOTE: ``json.loads`` raises ``RecursionError`` on '[[[[...' (damaged or planted): a traceback in every command
    that reads the store, where a damaged entry is embedded again (``lookup``) or refused naming it (rebuild)."""
    try:
        return json.loads(raw)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc


def store_denied(exc: BaseException, root: Path, near: Path) -> NoInputError | None:
    """Permission denied on a file of the store under ``root`` (in ``exc`` or what it was raised from): no input, 66
    naming the file, or the first directory on the way to it petal may not enter (``layout.denied``), as ``petal
    rebuild`` says it. Not damage: the entry is fine, a run must neither embed it again nor remove it. ``near``: the
    path named when the error names none. ``None`` for any other error."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen and not is_denied(cause):
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    if cause is None or not is_denied(cause):
        return None
    filename = getattr(cause, "filename", None)
    found = PYARROW_PATH.search(str(cause))
    path = Path(os.fsdecode(filename)) if filename else Path(found.group(1)) if found else near
    effective = os.access in os.supports_effective_ids
    for parent in reversed(path.parents):  # NOTE: the first directory of the store on the way that cannot be entered
        if inside_dir(parent, root) and os.path.isdir(parent) and not os.access(parent, os.X_OK,
                                                                                effective_ids=effective):
            return denied(parent)
    return denied(path)


def host_failed(exc: BaseException, near: Path) -> PetalIOError | None:
    """A read of a store entry that failed for the host, not the entry (in ``exc`` or what it was raised from: EIO,
    EMFILE, ENOMEM... as ``read_errors`` tells them apart, out of memory): 74 naming the file (``near`` when the error
    names none). Not damage: a good entry moved out of the store on a passing error was embedded again, or lost for
    good when its source is gone (a shard an additive run keeps). ``None`` for any other error."""
    from petal.pipeline.index.read_errors import HOST_STRERRORS, host_os_error

    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, MemoryError):
            return PetalIOError(f"cannot read the store entry {quote_path(near)}: out of memory; free memory, then "
                                "retry")
        if isinstance(cause, OSError):
            filename = getattr(cause, "filename", None)
            path = Path(os.fsdecode(filename)) if filename else near
            if cause.errno is not None:
                failed = host_os_error(path, cause)
                if failed is not None:
                    return failed
            else:  # NOTE: pyarrow's errors carry no errno, only the system's message
                reason = next((r for r in HOST_STRERRORS if r in str(cause)), None)
                if reason is not None:
                    return PetalIOError(f"cannot read {quote_path(path)}: {reason}; the host failed, not the file: "
                                        "free memory or file descriptors, or fix the disk, then retry")
        cause = cause.__cause__ or cause.__context__
    return None


def store_listing(directory: Path, root: Path) -> list[Path]:
    """The entries of a store directory under ``root``, sorted (none when it is not there); one petal may not read:
    66 naming it (``store_denied``; NOTE: raised here, not as an ``OSError``: a caller reading a source around it
    would name the source)."""
    try:
        return sorted(directory.iterdir()) if directory.is_dir() else []
    except OSError as exc:
        refused = store_denied(exc, root, directory)
        if refused is None:
            raise
        raise refused from exc


def inside_dir(path: Path, root: Path) -> bool:
    """``path`` is ``root`` or below it (no symlink resolved: the paths petal built)."""
    return path == root or root in path.parents


def check_npy(path: Path, root: Path, shape: tuple[int, int]) -> None:
    """``path`` is a regular ``.npy`` of float32 ``shape`` whose data is all there (header and size)."""
    fd = open_regular(path, root)
    with os.fdopen(fd, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        found, fortran, dtype = read_header(fh, max_header_size=10000)
        if tuple(found) != tuple(shape) or dtype != np.float32 or fortran:
            raise ValueError(f"{quote_path(path)} holds {dtype} {tuple(found)}, expected float32 {tuple(shape)}")
        need = fh.tell() + shape[0] * shape[1] * 4
        size = os.fstat(fh.fileno()).st_size
        if size < need:
            raise ValueError(f"{quote_path(path)} is truncated ({size} of {need} bytes)")


def _stat_key(info: ShardInfo) -> tuple[str, int, int, int, int, str]:
    return (info.abs_path, info.size, info.mtime_ns, info.ctime_ns, info.inode, info.footer_sha256)


def same_file(source: dict[str, Any], info: ShardInfo) -> bool:
    """True when ``source`` (an entry's record) describes the very file ``info`` does: same size, mtime,
    inode change time, inode and footer hash, and hashed well after its last change. The mtime alone is
    never trusted (copies and archives restore it); a record without these fields is not trusted at all."""
    try:
        return (int(source["size"]) == info.size and int(source["mtime_ns"]) == info.mtime_ns
                and int(source["ctime_ns"]) == info.ctime_ns and int(source["inode"]) == info.inode
                and str(source["footer_sha256"]) == info.footer_sha256 and info.footer_sha256 != ""
                and int(source["hashed_at_ns"]) - info.ctime_ns > RACY_NS)
    except (KeyError, TypeError, ValueError):
        return False


def shard_sha256(info: ShardInfo) -> str:
    """A local shard's sha256; an object's identity from its size, mtime and footer (no download). An OS error
    is raised as it is: callers retry it as a read of the source (``read_retrying``, pipeline/ingest/parquet.py)."""
    from petal.pipeline.ingest.remote import RemotePath, remote_sha256

    fault("read_content", str(info.path))
    if isinstance(info.path, RemotePath):  # NOTE: preflight's footer read gave it (ShardInfo.object_sha256)
        return info.object_sha256 or remote_sha256(info.path, info.size, info.mtime_ns)
    return sha256_file(info.path)


def id_spelling(info: ShardInfo) -> str | None:
    """The ``<shard>`` of the ``<shard>:<row>`` ids the shard's rows get when this run embeds it: the path as the run
    names it; ``None`` with an id column (ingest/path_ids.py)."""
    return None if info.has_id_column else str(info.path)


def same_spelling(entry: StoreEntry, info: ShardInfo) -> bool:
    """Whether the ids ``entry`` holds are spelled as this run would spell the shard's (``id_spelling``): a committed
    range (store/ranges.py), or an entry of the stopped ``--full`` run a run resumes, completes the run's embedding
    of the shard only then. An entry of an older petal (no ``id_prefix``) spelled its ids from its recorded path.

    NOTE: were it reused, a shard's entry would hold ids of two spellings (``/abs/x.parquet:0`` beside
    ``x.parquet:30``) and its ``id_prefix`` name only the later one, which the collision check trusts."""
    spelling = id_spelling(info)
    if spelling is None:
        return True
    return entry.meta.get(ID_PREFIX_KEY, entry.meta["source"]["path"]) == spelling


def shard_key(info: ShardInfo | str) -> str:
    """Stable key of an input shard: its absolute path (given, or the shard's)."""
    abs_path = info if isinstance(info, str) else info.abs_path
    return hashlib.sha256(abs_path.encode()).hexdigest()[:20]


def settings_fingerprint(settings: dict[str, Any]) -> str:
    blob = json.dumps({"store_format": STORE_FORMAT, **settings}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True)
class StoreEntry:
    """A committed shard: its vectors, the rows they belong to, and how it was made. ``checked``: every byte of its
    files was found to be what was committed, by this process (written by it, or read with ``verify``); a version is
    built from an unchecked entry only through ``VectorReader``, which hashes the bytes as the build reads them."""

    path: Path
    meta: dict[str, Any]
    checked: bool = field(default=False, compare=False, kw_only=True)  # NOTE: a subclass adds positional fields

    @property
    def fingerprint(self) -> str:
        return self.path.name

    @property
    def num_embedded(self) -> int:
        return int(self.meta["counts"]["embedded"])

    @property
    def num_tokens(self) -> int:
        """Tokens of the embedded rows (0 in an entry of an older petal, which did not count them)."""
        return int(self.meta["counts"].get("tokens", 0))

    @property
    def num_rows(self) -> int:
        """Rows of the shard the entry was made from (embedded or not)."""
        return int(self.meta["counts"]["rows"])

    @property
    def num_truncated(self) -> int:
        return int(self.meta["counts"]["truncated"])

    @property
    def skipped(self) -> dict[str, int]:
        """Rows not embedded, by reason."""
        return {str(k): int(v) for k, v in self.meta["counts"]["skipped"].items()}

    @property
    def source_sha256(self) -> str:
        return str(self.meta["source"]["sha256"])

    def embeddings(self) -> np.ndarray:
        """``[num_rows, dim]`` float32, memory-mapped (rows that were not embedded are zero)."""
        return np.load(self.path / "embeddings.npy", mmap_mode="r", allow_pickle=False)

    def rows(self) -> pa.Table:
        return pq.read_table(self.path / "rows.parquet")

    def rejects(self) -> pa.Table:
        return pq.read_table(self.path / "rejects.parquet")


class EmbeddingStore:
    """``damaged``: the entries (and committed ranges) found damaged and moved out of sight so their shard is embedded
    again (``repaired``), a run's report's ``damaged_entries`` when it passes its list; ``left``: what it could not
    delete (``leftovers.leave``), the report's ``pruned.left``."""

    def __init__(self, root: Path, damaged: list[dict[str, str]] | None = None,
                 left: list[dict[str, str]] | None = None) -> None:
        self.root = root
        self.damaged = damaged if damaged is not None else []
        self.shards_dir = root / "shards"
        self.tmp_dir = root / "tmp"
        self._sha256: dict[tuple[str, int, int, int, int, str], str] = {}
        self._hashed_at_ns: dict[tuple[str, int, int, int, int, str], int] = {}
        # the --full run whose commits are stamped with it (``begin_full_run``; a worker's: ``join_full_run``)
        self.full_run: str | None = None
        self.full_run_resumed = False  # this --full run resumes a stopped one: its commits are looked up
        self.left = left if left is not None else []  # what it could not delete (said on stderr; pruned.left)

    def open(self) -> None:
        """Create the store's directories and empty ``tmp/``; a symlink or a file in their place is refused (73). What
        ``tmp/`` holds that cannot be removed is said and left (``left``) for the next run to try again."""
        for sub in (self.root, self.shards_dir, self.tmp_dir):
            if sub.is_symlink() or (sub.exists() and not sub.is_dir()):
                raise OutputError(f"{quote_path(sub)} is a symlink or not a directory; petal keeps its store inside "
                                  "the output directory: remove it")
        self.shards_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self.remove_leftovers()

    def remove_leftovers(self) -> None:
        """Empty ``tmp/`` (entries a crashed run was writing, discarded ones), when it is a real directory; creates
        nothing (``petal rebuild``). What cannot be removed is said and left (``left``)."""
        if self.tmp_dir.is_symlink() or not self.tmp_dir.is_dir():
            return
        # NOTE: one by one, each said when it cannot be removed: rmtree of the whole of tmp/ made a leftover there that
        # petal may not delete (a discarded entry) fail every later run (73 'petal may not write f')
        for path in sorted(self.tmp_dir.iterdir()):
            remove_or_leave(path, "a store entry a stopped run was writing, or one discarded", self.left)

    def begin_full_run(self, publish_mark: str) -> bool:
        """A ``--full`` run begins (``publish_mark``: ``OutputDir.publish_mark``): its commits are stamped with a token
        (``full-run.json``), so that its rerun after a stop reuses what it committed (``own_commit``) instead of
        embedding every shard again. The token of a stopped ``--full`` run is taken over only while nothing was
        published since it began (a rebuild, a run killed right after its swap, a rollback by hand after one): then a
        ``--full`` embeds everything again. Returns whether it resumes a stopped run. A marker that cannot be written
        (a directory in its place, a read-only store) is said: the run embeds every shard, as ``--full`` did."""
        pending = _pending_full_run(self.root)
        self.full_run_resumed = pending is not None and pending[1] == publish_mark
        if self.full_run_resumed and pending is not None:
            self.full_run = pending[0]
            return True
        token = uuid.uuid4().hex
        try:
            write_json_atomic(self.root / FULL_RUN_FILE, {"token": token, "began_over": publish_mark,
                                                          "started_ns": time.time_ns()})
        except OSError as exc:
            warn(f"cannot record this --full run in {quote_path(self.root / FULL_RUN_FILE)} "
                 f"({exc.strerror or exc}); a stop will not be resumed (its rerun embeds every shard again)")
            self.full_run = None
            return False
        self.full_run = token
        return False

    def join_full_run(self) -> None:
        """(a worker of a ``--full`` run) Stamp this store's commits with the run's token (``begin_full_run``)."""
        pending = _pending_full_run(self.root)
        self.full_run = pending[0] if pending is not None else None

    def end_full_run(self) -> None:
        """A run ended with a version live (published, or nothing to do): no ``--full`` run is left to resume (a
        failure to remove the file is harmless: the next ``--full`` sees the live version has changed, or is told)."""
        self.full_run = None
        with contextlib.suppress(OSError):
            (self.root / FULL_RUN_FILE).unlink(missing_ok=True)

    def lookup_all(self, shards: list[ShardInfo], fingerprints: list[str], full: bool,
                   verify: bool = True) -> list[StoreEntry | None]:
        """``lookup`` of each shard: the committed entries a run reuses. ``full`` (``--full``): only those the stopped
        ``--full`` run it resumes committed (none unless it resumes one: not even looked up)."""
        if full and not self.full_run_resumed:
            return [None] * len(shards)
        entries = [self.lookup(info, fingerprint, verify=verify) for info, fingerprint in zip(shards, fingerprints)]
        if not full:
            return entries  # NOTE: an unchanged shard's entry keeps the ids it was committed with (README)
        # a --full run embeds every shard under its own spelling: the stopped one's entry of another is embedded again
        return [self.own_commit(entry) if entry is not None and same_spelling(entry, info) else None
                for entry, info in zip(entries, shards)]

    def own_commit(self, entry: StoreEntry | None) -> StoreEntry | None:
        """``entry`` when this ``--full`` run (or the stopped one it resumes) committed it, else ``None``."""
        if entry is None or self.full_run is None or entry.meta.get(FULL_RUN_KEY) != self.full_run:
            return None
        return entry

    def _entries_for(self, key: str) -> list[StoreEntry]:
        """The committed entries of a shard key (any settings); one petal may not read: 66 naming it
        (``store_listing``)."""
        entries = []
        for d in store_listing(self.shards_dir / key, self.root):
            try:
                entries.append(self.read_entry(d))
            except (FileNotFoundError, DamagedEntry):
                continue  # a damaged entry is no cache: its shard is hashed (and embedded) again
        return entries

    def read_entry(self, path: Path, verify: bool = False) -> StoreEntry:
        """The committed entry at ``path``, checked: ``entry.json`` readable with its fields, the files
        regular and inside the store, ``embeddings.npy`` as large as its header says, the Parquet
        footers readable; with ``verify`` (an entry a run reuses), every byte of its files against the sha256
        recorded at the commit. ``FileNotFoundError`` without ``entry.json``; ``DamagedEntry`` otherwise; a file (or a
        directory on the way to it) petal may not read: ``NoInputError`` (66) naming it (``store_denied``)."""
        try:
            return self._read_entry(path, verify)
        except (OSError, DamagedEntry) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            refused = store_denied(exc, self.root, path) or host_failed(exc, path)
            if refused is None:
                raise
            raise refused from exc

    def _read_entry(self, path: Path, verify: bool) -> StoreEntry:
        meta_file = path / "entry.json"
        if not meta_file.exists() and not meta_file.is_symlink():
            if not os.path.lexists(path):
                raise FileNotFoundError(meta_file)  # no entry: its shard is embedded (a rebuild: 78, none stored)
            if path.is_symlink() or not path.is_dir():
                raise DamagedEntry(path, ValueError("it is not a directory"))
            # NOTE: an entry is committed whole (one rename): its directory without entry.json is damaged, as one
            # without embeddings.npy is (65 where nothing can embed it again). Was taken for no entry: embedded again
            # without a word, and a kept shard's or a rebuild's 78 'the store has no embeddings'
            raise DamagedEntry(path, FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(meta_file)))
        name: str | None = "entry.json"  # the file being checked, named by the damage (``damage_reason``)
        try:
            meta = _entry_json(read_regular(meta_file, self.root, ENTRY_MAX_BYTES))
            rows = int(meta["counts"]["rows"])
            dim = int(meta["dim"])
            int(meta["counts"]["embedded"]), int(meta["counts"]["truncated"]), int(meta["counts"].get("tokens", 0))
            if not isinstance(meta["counts"]["skipped"], dict):  # NOTE: a run sums its counts (BadRowGate)
                raise TypeError("counts.skipped is not an object of reasons and counts")
            [int(count) for count in meta["counts"]["skipped"].values()]
            str(meta["source"]["sha256"]), str(meta["source"]["path"]), str(meta["source"]["abs_path"])
            int(meta["source"]["size"]), int(meta["source"]["mtime_ns"])
            name = "embeddings.npy"
            check_npy(path / name, self.root, (rows, dim))
            for name in DATA_FILES[1:]:
                check_regular(path / name, self.root)
                pq.read_metadata(path / name)
            name = None  # NOTE: its errors name the file
            fresh = check_checksums(path, meta, full=verify)
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException, PetalError) as exc:
            raise DamagedEntry(path, exc, name) from exc
        if fresh:
            record_stat(path, meta, fresh)
        return StoreEntry(path, meta, checked=verify)

    def content_sha256(self, info: ShardInfo) -> str:
        """The shard's sha256: reused from an entry whose source had the same identity (see
        ``same_file``), else read from the file (cheaper than embedding it again)."""
        stat_key = _stat_key(info)
        # NOTE: an object's mtime may have whole-second resolution (S3): its footer hash is always taken (cheap)
        if stat_key not in self._sha256 and "://" in info.abs_path:
            self._sha256[stat_key] = shard_sha256(info)
        if stat_key not in self._sha256:
            for entry in self._entries_for(shard_key(info)):
                if same_file(entry.meta.get("source", {}), info):
                    self._sha256[stat_key] = str(entry.meta["source"]["sha256"])
                    self._hashed_at_ns[stat_key] = int(entry.meta["source"]["hashed_at_ns"])
                    break
            else:
                self._hashed_at_ns[stat_key] = time.time_ns()
                self._sha256[stat_key] = shard_sha256(info)
        return self._sha256[stat_key]

    def hashed_at_ns(self, info: ShardInfo) -> int:
        """When the shard's content was hashed (by this run, or by the run whose hash is reused)."""
        return self._hashed_at_ns.get(_stat_key(info), 0)

    def remember_sha256(self, shards: list[ShardInfo], sha256: list[str]) -> None:
        """Content hashes computed elsewhere (a worker process is handed the coordinator's: no re-read)."""
        for info, digest in zip(shards, sha256):
            self._sha256[_stat_key(info)] = digest

    def fingerprint(self, info: ShardInfo, settings_fp: str) -> str:
        blob = f"{settings_fp}:{self.content_sha256(info)}".encode()
        return hashlib.sha256(blob).hexdigest()[:24]

    def lookup(self, info: ShardInfo | str, fingerprint: str, repair: bool = True,
               verify: bool = True) -> StoreEntry | None:
        """The committed entry of ``info`` with ``fingerprint``, or ``None``. A damaged entry is moved out
        of sight and ``None`` returned (its shard is embedded again), unless ``repair`` is off: then it
        raises ``BadInputError`` (65) naming the file (``petal rebuild`` has no sources to re-embed).
        ``verify`` off (a run whose reused entries go into no version; ``check_bytes`` before they do): the sha256 of
        the files changed since the commit alone (``check_checksums``)."""
        path = self.shards_dir / shard_key(info) / fingerprint
        try:
            return self.read_entry(path, verify=verify)
        except FileNotFoundError:
            return None
        except DamagedEntry as exc:
            if not repair:
                raise BadInputError(str(exc)) from exc
            self.repaired(exc, info)
            return None

    def repaired(self, damage: DamagedEntry, info: ShardInfo | str, what: str = "the shard") -> None:
        """A damaged entry (or committed range: ``what``) of the shard ``info`` moved out of sight, to be embedded
        again from its source: said on stderr and counted (``damaged``)."""
        warn(f"{damage}; embedding {what} again")
        shard = info if isinstance(info, str) else str(info.path)
        self.damaged.append({"entry": str(damage.path), "shard": shard, "reason": damage.reason})
        self.discard(damage.path)

    def check_bytes(self, entry: StoreEntry) -> None:
        """Every byte of ``entry``'s files against the sha256 recorded at its commit (of an entry looked up without
        ``verify``). A damaged one is moved out of sight and raises ``TemporaryFailure`` (75): the next run embeds
        its shard again, as it would have had it been checked at the lookup; a file petal may not read: 66."""
        try:
            self.read_entry(entry.path, verify=True)
        except DamagedEntry as exc:
            self.discard(entry.path)
            raise TemporaryFailure(f"{exc}; it is moved out of the store: run again to embed the shard again") \
                from exc

    def writer(self, info: ShardInfo, fingerprint: str, settings: dict[str, Any], dim: int,
               part: RowRange | None = None) -> ShardWriter:
        """A writer of the shard's entry, or (``part``) of one row-group range of it (store/ranges.py)."""
        return ShardWriter(self, info, fingerprint, settings, dim, part)

    def discard(self, entry_dir: Path) -> None:
        """Remove a committed entry: first out of sight (one rename into ``tmp/``), then from disk.

        NOTE: never ``rmtree`` an entry in place: a crash midway would leave an ``entry.json``
        beside missing files, which ``lookup`` would take for a committed entry.
        """
        trash = self.tmp_dir / f"discard-{uuid.uuid4().hex[:12]}"
        os.replace(entry_dir, trash)
        # NOTE: out of sight now; what cannot be deleted is said, and the next run's ``open`` tries again
        remove_or_leave(trash, f"the discarded store entry {entry_dir.parent.name}/{entry_dir.name}", self.left)

    def listing(self, directory: Path, dirs_only: bool = True) -> list[Path]:
        """What a clean-up walks in ``directory`` of the store, sorted: its real directories (``dirs_only``: never a
        link, whose target may lie outside OUT), else every name. One petal cannot list is said and left (``left``):
        the clean-up goes on with the rest, and the next one tries again."""
        if not dirs_only:
            try:
                return sorted(directory.iterdir())
            except OSError as exc:
                leave(directory, "a store directory", f"cannot list it: {exc.strerror or exc}", self.left)
                return []
        return real_dirs(directory, self.left)

    def remove_if_empty(self, directory: Path) -> None:
        """Remove a directory of the store the clean-up emptied; one that cannot be is said and left (``left``)."""
        try:
            if not any(directory.iterdir()):
                directory.rmdir()
        except OSError as exc:
            leave(directory, "an empty store directory", f"{exc.strerror or exc}", self.left)

    def discard_unused(self, path: Path, what: str) -> bool:
        """``discard`` what no version uses; one that cannot be moved out of the store is said and left in place
        (``left``: the next clean-up tries again). NOTE: the OSError ended the whole clean-up with a warning that
        named no path."""
        try:
            fault("store_prune", path)
            self.discard(path)
        except OSError as exc:
            leave(path, what, f"cannot move it into {quote_path(self.tmp_dir)}: {exc.strerror or exc}", self.left)
            return False
        return True


class ShardWriter:
    """Collects one shard's vectors (memory-mapped, bounded host memory) and commits them at once.

    ``part``: only that row-group range of the shard, committed as a part (``OUT/store/parts``) that
    ``store/ranges.py`` assembles into the shard's entry once every range of the shard is committed.
    """

    def __init__(self, store: EmbeddingStore, info: ShardInfo, fingerprint: str, settings: dict[str, Any],
                 dim: int, part: RowRange | None = None) -> None:
        self.store = store
        self.info = info
        self.fingerprint = fingerprint
        self.settings = settings
        self.dim = dim
        self.part = part
        self.first_row = part.first_row if part is not None else 0
        self.num_rows = part.num_rows if part is not None else info.num_rows
        name = f"{shard_key(info)}-{part.name}" if part is not None else shard_key(info)
        self.tmp = store.tmp_dir / f"{name}-{uuid.uuid4().hex[:8]}"
        embeddings = self.tmp / "embeddings.npy"
        shape = (self.num_rows, dim)
        self._vectors: np.memmap | None = None  # None: an empty shard (no rows to write)
        try:
            with writing(embeddings):
                fault("store_entry_open", embeddings)
                self.tmp.mkdir(parents=True)
                if self.num_rows > 0:
                    try:
                        self._vectors = np.lib.format.open_memmap(embeddings, mode="w+", dtype=np.float32,
                                                                  shape=shape)
                        _allocate(embeddings)
                    except OSError as exc:  # NOTE: the size comes from the shard's footer, which may not be true
                        exc.strerror = (f"{exc.strerror or exc} (reserving {4 * dim * self.num_rows / 2**30:,.1f} "
                                        f"GiB for the {self.num_rows:,} rows the footer of "
                                        f"{quote_path(info.path)} counts)")
                        raise
                else:
                    np.save(embeddings, np.zeros(shape, dtype=np.float32), allow_pickle=False)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)  # a full disk gets its space back at once
            raise
        # NOTE: the rows and ids of each batch added, as arrays (8 bytes a row; a string id its bytes and an offset):
        # as Python lists (an int object per row, every id's str kept alive) they took ~100 bytes a row, 200 MB for
        # a shard of 2M rows, on top of the bounded read window
        self._id_type = entry_id_type(info)
        self._row_chunks: list[np.ndarray] = []
        self._id_chunks: list[pa.Array] = []
        self._token_chunks: list[np.ndarray] = []  # tokens of each added row (the report's ``tokens``)
        self._num_added = 0
        self._rejects: list[tuple[int, str]] = []
        self.num_truncated = 0
        # a range's part only: which rows were truncated, and the ids its rejects had taken (row -> id), for its
        # assembly (store/ranges.py: a row it rejects as a repeated id leaves every count)
        self._truncated_chunks: list[np.ndarray] = []
        self._claimed: dict[int, Any] = {}
        self.pending = 0  # documents handed to the engine whose vectors have not come back
        self.input_done = False  # every row of the shard has been read

    def add(self, rows: list[int], ids: list, vectors: np.ndarray, tokens: np.ndarray | None = None) -> None:
        """Vectors ``[len(rows), dim]`` for ``rows`` (``tokens``: each row's token count, ``[len(rows)]``; ``None``:
        not counted); non-finite ones become rejects."""
        tokens = np.zeros(len(rows), dtype=np.int32) if tokens is None else np.asarray(tokens, dtype=np.int32)
        finite = np.isfinite(vectors).all(axis=1)
        if not finite.all():
            self._rejects.extend((row, "non_finite_embedding") for row, ok in zip(rows, finite) if not ok)
            if self.part is not None:  # NOTE: its id was taken at the read checks: a later range's row repeats it
                self._claimed.update((row, doc_id) for row, doc_id, ok in zip(rows, ids, finite) if not ok)
            rows = [row for row, ok in zip(rows, finite) if ok]
            ids = [doc_id for doc_id, ok in zip(ids, finite) if ok]
            vectors = vectors[finite]
            tokens = tokens[finite]
        if rows:
            assert self._vectors is not None  # rows exist, so the shard has some
            index = np.asarray(rows, dtype=np.int64) - self.first_row
            if (np.diff(index) == 1).all():  # consecutive rows, the common case: a slice beats fancy indexing
                self._vectors[index[0] : index[-1] + 1] = vectors
            else:  # rows with gaps (skips, a split batch)
                self._vectors[index] = vectors
            self._row_chunks.append(index + self.first_row)
            self._id_chunks.append(pa.array(ids, self._id_type))
            self._token_chunks.append(tokens)
            self._num_added += len(index)

    def reject(self, rejects: list[tuple[int, str]], claimed: Sequence[tuple[int, Any]] = ()) -> None:
        """Rows not embedded, with their reasons; ``claimed``: ``(row, id)`` of those whose id the read checks had
        taken (``TokenizedDocs.claimed``)."""
        self._rejects.extend(rejects)
        if self.part is not None:
            self._claimed.update(claimed)

    def truncated(self, rows: Sequence[int]) -> None:
        """``rows`` were cut at the model's max length (counted; a range's part keeps which)."""
        self.num_truncated += len(rows)
        if self.part is not None and len(rows):
            self._truncated_chunks.append(np.asarray(rows, dtype=np.int64))

    @property
    def ready(self) -> bool:
        return self.input_done and self.pending == 0

    def commit(self) -> StoreEntry:
        """Flush, fsync and make the entry visible with one rename (exit 74 naming the path on an I/O error)."""
        self._check_all_rows_read()
        with writing(self.tmp):
            return self._commit()

    def _check_all_rows_read(self) -> None:
        """Every row the footer counts was read (embedded or skipped with a reason), else ``BadInputError`` (65)
        naming the shard: a footer that claims more rows than its pages hold (an edited or damaged file) was
        committed as it was, the rows it lacks in no count, the index published, exit 0."""
        read = self._num_added + len(self._rejects)
        if read < self.num_rows:
            where = f" (rows {self.first_row}-{self.first_row + self.num_rows - 1})" if self.part is not None else ""
            raise BadInputError(f"{quote_path(self.info.path)}: its footer counts {self.num_rows:,} rows{where}, its "
                                f"pages hold {read:,}: the file is damaged; write it again")

    def _commit(self) -> StoreEntry:
        fault("store_commit_begin", self.tmp / "embeddings.npy")
        if self._vectors is not None:
            self._vectors.flush()
            del self._vectors
            self._vectors = None
        added = np.concatenate(self._row_chunks) if self._row_chunks else np.zeros(0, dtype=np.int64)
        order = np.argsort(added, kind="stable")
        rows = added[order]
        ids = pa.concat_arrays(self._id_chunks).take(pa.array(order)) if self._id_chunks else \
            pa.array([], self._id_type)
        tokens = np.concatenate(self._token_chunks)[order] if self._token_chunks else np.zeros(0, dtype=np.int32)
        self._row_chunks, self._id_chunks, self._token_chunks = [], [], []
        rejects = sorted(self._rejects)
        row_columns: dict[str, pa.Array] | None = None
        reject_columns: dict[str, pa.Array] | None = None
        if self.part is not None:
            from petal.pipeline.store.ranges import part_dir

            final, extra = part_dir(self.store, self.info, self.fingerprint, self.part), {"range": self.part.record()}
            cut = np.concatenate(self._truncated_chunks) if self._truncated_chunks else np.zeros(0, dtype=np.int64)
            reject_rows = np.array([row for row, _ in rejects], dtype=np.int64)
            row_columns = {"tokens": pa.array(tokens, pa.int32()), "truncated": pa.array(np.isin(rows, cut))}
            reject_columns = {"id": pa.array([self._claimed.get(row) for row, _ in rejects], self._id_type),
                              "truncated": pa.array(np.isin(reject_rows, cut), pa.bool_())}
        else:
            final, extra = self.store.shards_dir / shard_key(self.info) / self.fingerprint, {}
        return commit_entry(self.store, self.tmp, final, self.info, self.settings, self.dim, rows, ids,
                            rejects, self.num_rows, self.num_truncated, extra, int(tokens.sum()),
                            row_columns, reject_columns)

    def abort(self) -> None:
        self._vectors = None
        shutil.rmtree(self.tmp, ignore_errors=True)


def entry_id_type(info: ShardInfo) -> pa.DataType:
    """The type of a store entry's ids (``rows.parquet``'s ``id``): int64 for integer ids, null for an id column of
    type null (no ids), else string (string ids, or ``<shard>:<row>`` where there is no id column)."""
    return pa.int64() if integer_ids(info.id_type) else pa.null() if no_ids(info.id_type) else pa.string()


def _pending_full_run(root: Path) -> tuple[str, str] | None:
    """``(token, the publish mark it began over)`` of a ``--full`` run that has not published (``full-run.json``), or
    ``None`` (none, or a file that is no such record: then the run embeds every shard, as ``--full`` always did)."""
    try:
        data = json.loads(read_regular(root / FULL_RUN_FILE, root, 4096))
    except (OSError, ValueError, RecursionError, PetalError):
        return None
    if not isinstance(data, dict):
        return None
    token, mark = data.get("token"), data.get("began_over")
    if not isinstance(token, str) or not re.fullmatch(r"[0-9a-f]{32}", token) or not isinstance(mark, str):
        return None
    return token, mark


def commit_entry(store: EmbeddingStore, tmp: Path, final: Path, info: ShardInfo, settings: dict[str, Any], dim: int,
                 rows: np.ndarray, ids: list | pa.Array, rejects: list[tuple[int, str]], num_rows: int,
                 num_truncated: int, extra: dict[str, Any], num_tokens: int = 0,
                 row_columns: dict[str, pa.Array] | None = None,
                 reject_columns: dict[str, pa.Array] | None = None) -> StoreEntry:
    """Write ``rows.parquet``, ``rejects.parquet`` and ``entry.json`` beside ``tmp/embeddings.npy`` (``num_rows``
    rows), fsync them, and make ``tmp`` visible as ``final`` with one rename (a committed entry is replaced).
    ``num_tokens``: the tokens of the embedded rows; ``row_columns``, ``reject_columns``: more per-row columns of
    ``rows.parquet`` and ``rejects.parquet`` (a range's part: what its assembly needs to take a row it rejects as a
    repeated id out of every count)."""
    id_type = entry_id_type(info)
    id_column = ids if isinstance(ids, pa.Array) else pa.array(ids, id_type)
    columns = {"row": pa.array(rows, pa.int64()), "id": id_column, **(row_columns or {})}
    pq.write_table(pa.table(columns), tmp / "rows.parquet", write_page_checksum=True)
    fault("store_commit_mid", tmp / "rejects.parquet")
    pq.write_table(pa.table({"row": pa.array([r for r, _ in rejects], pa.int64()),
                             "reason": pa.array([why for _, why in rejects], pa.string()), **(reject_columns or {})}),
                   tmp / "rejects.parquet", write_page_checksum=True)
    reasons: dict[str, int] = {}
    for _, why in rejects:
        reasons[why] = reasons.get(why, 0) + 1
    meta = {
        "store_format": STORE_FORMAT,
        "source": {"path": str(info.path), "abs_path": info.abs_path, "size": info.size,
                   "mtime_ns": info.mtime_ns, "sha256": store.content_sha256(info),
                   "ctime_ns": info.ctime_ns, "inode": info.inode,
                   "footer_sha256": info.footer_sha256, "hashed_at_ns": store.hashed_at_ns(info),
                   "rows": info.num_rows},
        "settings": settings,
        "dim": dim,
        "dtype": "float32",
        "id_type": "int64" if id_type == pa.int64() else "null" if id_type == pa.null() else "string",
        ID_PREFIX_KEY: id_spelling(info),  # what ids without an id column are spelled from
        "counts": {"rows": num_rows, "embedded": len(rows), "skipped": reasons, "truncated": num_truncated,
                   "tokens": int(num_tokens)},
        **extra,
    }
    if store.full_run is not None:
        meta[FULL_RUN_KEY] = store.full_run
    meta[CHECKSUMS_KEY] = {name: sha256_file(tmp / name) for name in DATA_FILES}
    meta[STAT_KEY] = {name: file_stat(tmp / name) for name in DATA_FILES}  # NOTE: the files are not written again
    write_json_atomic(tmp / "entry.json", meta)
    for name in DATA_FILES:
        with open(tmp / name, "rb+") as fh:
            os.fsync(fh.fileno())
    fsync_dir(tmp)
    fault("store_commit_rename", final)
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():  # same content and settings committed before (--full, a retried range): replace it
        store.discard(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    fault("store_committed", final)  # NOTE: committed, not yet reported (a worker's "commit" event comes after)
    return StoreEntry(final, meta, checked=True)


class VectorReader:
    """An unchecked entry's ``embeddings.npy`` for a build, every byte hashed as the build reads it: ``take`` gives
    rows (ascending, past those taken before) from the same mapped pages it hashes, a step at a time (the bytes still
    in the CPU's cache when they are copied out), ``finish`` hashes the rest and compares the whole file with the
    sha256 recorded at the commit (its small files: ``check_row_files``); a mismatch, a short file: ``BadInputError``
    (65) naming the entry, the file and the shard, before anything is published.

    NOTE: an additive run hashes no kept entry up front (``lookup(verify=False)``: only files whose stat changed),
    so rot that changes no stat (the disk's, not a write) went into the new version. Hashed here, the bytes the index
    is built from are the bytes checked, and the check costs no read the build does not make anyway."""

    STEP_BYTES = 1 << 20  # hashed, then copied out, at a time

    def __init__(self, entry: StoreEntry) -> None:
        self.entry = entry
        self.path = entry.path / "embeddings.npy"
        self._digest = hashlib.sha256()
        with open(self.path, "rb") as fh:
            try:
                version = np.lib.format.read_magic(fh)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
                    np.lib.format.read_array_header_2_0
                shape, _, _ = read_header(fh, max_header_size=10000)
            except ValueError as exc:  # NOTE: not a FAISS failure (78): the header's bytes changed
                self._damaged(f"embeddings.npy: {one_line(str(exc))[:200]}")
            self._header = fh.tell()
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        self._map.madvise(mmap.MADV_SEQUENTIAL)  # read ahead: every page is hashed, in order
        num_rows, dim = (int(shape[0]), int(shape[1])) if len(shape) == 2 else (0, 0)
        self._row_bytes = dim * 4
        if len(self._map) < self._header + num_rows * self._row_bytes:
            self.close()
            self._damaged(f"embeddings.npy is truncated ({len(self._map)} of "
                          f"{self._header + num_rows * self._row_bytes} bytes)")
        self._vectors: np.ndarray | None = np.frombuffer(self._map, np.float32, num_rows * dim,
                                                         self._header).reshape(num_rows, dim)
        self._hashed = 0  # bytes of the file hashed so far

    def _hash_to(self, end: int) -> None:
        if end > self._hashed:
            with memoryview(self._map) as view:
                self._digest.update(view[self._hashed : end])
            self._hashed = end

    def take(self, rows: np.ndarray) -> np.ndarray:
        """``[len(rows), dim]`` float32 of ``rows`` (ascending, each at or past the rows taken before)."""
        assert self._vectors is not None
        out = np.empty((len(rows), self._vectors.shape[1]), dtype=np.float32)
        step = max(1, self.STEP_BYTES // max(1, self._row_bytes))
        done = 0
        while done < len(rows):
            first = (self._hashed - self._header) // self._row_bytes if self._hashed > self._header else 0
            stop = max(first + step, int(rows[done]) + 1)
            self._hash_to(self._header + stop * self._row_bytes)
            end = done + int(np.searchsorted(rows[done:], stop))
            out[done:end] = self._vectors[rows[done:end]]
            done = end
        return out

    def finish(self) -> None:
        """Hash the rest of the file, and check the entry's files against the sha256 recorded at its commit."""
        self._hash_to(len(self._map))
        self.close()
        recorded = self.entry.meta.get(CHECKSUMS_KEY)
        if not isinstance(recorded, dict):
            return  # NOTE: an older petal's entry, without the record: trusted as before
        if self._digest.hexdigest() != recorded.get("embeddings.npy"):
            self._damaged("embeddings.npy does not match the sha256 recorded when it was committed")

    def close(self) -> None:
        self._vectors = None  # NOTE: the array holds the map's buffer: a map with views cannot close
        if not self._map.closed:
            self._map.close()

    def _damaged(self, reason: str) -> NoReturn:
        raise unusable_entry(self.entry, reason)


def unusable_entry(entry: StoreEntry, reason: str) -> BadInputError:
    """65 for an entry a build found damaged, naming it and its shard."""
    source = entry.meta.get("source", {}).get("path", "?")
    return BadInputError(f"{DamagedEntry(entry.path, ValueError(reason))}: it holds the embeddings of "
                         f"{quote_path(Path(str(source)))}; nothing was published: name that shard as a SOURCE to "
                         "embed it again")


def check_row_files(entry: StoreEntry) -> None:
    """An unchecked entry's ``rows.parquet`` and ``rejects.parquet`` (small) against the sha256 recorded at its
    commit, before a build reads them: 65 naming the entry (``unusable_entry``). NOTE: read unchecked, a page rotted
    under an unchanged stat failed in pyarrow ('Invalid page header', 'Corrupt snappy compressed data') and was
    reported as 74 'cannot write' the version being staged."""
    recorded = entry.meta.get(CHECKSUMS_KEY)
    if entry.checked or not isinstance(recorded, dict):
        return
    for name in DATA_FILES[1:]:
        if sha256_file(entry.path / name) != recorded.get(name):
            raise unusable_entry(entry, f"{name} does not match the sha256 recorded when it was committed")


def file_stat(path: Path) -> list[int]:
    """What a write, a replacement or a copy of the file changes (``st_ctime_ns`` cannot be set back by hand)."""
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def check_checksums(path: Path, meta: dict[str, Any], full: bool = True) -> dict[str, list[int]]:
    """The entry's files at ``path`` hash to what ``entry.json`` recorded at the commit (``ValueError`` naming the
    first that does not); an entry without the record (an older petal's) is not checked. Not ``full`` (a run whose
    entries go into no version, a kept shard's): a file whose size, mtime, ctime and inode are still the recorded
    ones is not read. Returns the stat of each file that was hashed whole and matched, whose stat is not the
    recorded one (a copy, a restore: new inodes and times), unchanged while it was hashed and older than ``RACY_NS``
    (a write in the same clock tick could change it unseen): ``_read_entry`` records it, so the next run reads only
    what changed since this check. NOTE: without that, a store copied with ``cp -r`` was hashed in full by every
    later run."""
    recorded = meta.get(CHECKSUMS_KEY)
    if recorded is None:
        return {}
    if not isinstance(recorded, dict):
        raise TypeError(f"{CHECKSUMS_KEY} is not an object of file names and sha256")
    stats = meta.get(STAT_KEY)
    known = stats if isinstance(stats, dict) else {}
    fresh = {}
    for name in DATA_FILES:
        before = file_stat(path / name)
        if not full and known.get(name) == before:
            continue
        started = time.time_ns()
        if sha256_file(path / name) != recorded.get(name):
            raise ValueError(f"{name} does not match the sha256 recorded when it was committed")
        if known.get(name) != before and file_stat(path / name) == before and \
                started - max(before[1], before[2]) > RACY_NS:
            fresh[name] = before
    return fresh


def record_stat(path: Path, meta: dict[str, Any], fresh: dict[str, list[int]]) -> None:
    """``entry.json`` at ``path`` rewritten (atomically) with the ``fresh`` stat of files just hashed whole and found
    intact, its mtime kept (a worker's recovery reads it as the commit's time: ``entry_written_since``). Best effort:
    a store petal may read but not write keeps its record, and is hashed again next time."""
    known = meta.get(STAT_KEY)
    meta[STAT_KEY] = {**(known if isinstance(known, dict) else {}), **fresh}
    meta_file = path / "entry.json"
    try:
        st = os.stat(meta_file, follow_symlinks=False)
        write_json_atomic(meta_file, meta)
        os.utime(meta_file, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    except OSError:
        return


def _allocate(path: Path) -> None:
    """Reserve the disk blocks of a memory-mapped file now.

    NOTE: the memmap is a sparse file; a page stored into it on a full disk kills the process with
    SIGBUS instead of raising. Allocating up front turns a full disk into ENOSPC here (exit 74).
    """
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):  # no fallocate here: sparse it is
            raise
    finally:
        os.close(fd)


@dataclass(frozen=True)
class DeferredIdentity:
    """Store fingerprints and settings that are not known yet when embedding starts (the weights' sha256 is
    still being hashed): ``resolve()`` returns ``(fingerprints, settings)``; ``StoreSink`` calls it once, before
    its first commit (a fingerprint names an entry; nothing needs it earlier)."""

    resolve: Callable[[], tuple[list[str], dict[str, Any]]]


class StoreSink:
    """Routes step results to per-shard writers and commits each shard once it is complete.

    A shard is complete when all its rows have been read (``final`` chunk seen) and every
    document handed to the engine has come back.
    """

    def __init__(self, store: EmbeddingStore, shards: list[ShardInfo], fingerprints: list[str] | DeferredIdentity,
                 settings: dict[str, Any] | None, dim: int, transform: OutputTransform | None = None,
                 ranges: list[RowRange] | None = None) -> None:
        self.store = store
        # ``ranges``: the units of work (whole shards or row-group ranges); the index of a chunk, a key and a
        # commit is then a position in ``ranges`` (``None``: one unit per shard, the index a position in ``shards``)
        self.ranges = ranges
        # NOTE: the output transform (--dim, int8/binary, float16) is applied here, where vectors enter
        # the store: the engine's vectors are model vectors, the store's are transform.stored() vectors.
        self.transform = transform
        self.shards = shards
        self._deferred = fingerprints if isinstance(fingerprints, DeferredIdentity) else None
        self.fingerprints: list[str] | None = None if isinstance(fingerprints, DeferredIdentity) else fingerprints
        self.settings = settings
        self.dim = dim
        self._writers: dict[int, ShardWriter] = {}
        self._positions: dict[int, int] = {}  # writer (chunk index) -> position in ``shards``

    def _writer(self, shard_index: int) -> ShardWriter:
        if shard_index not in self._writers:
            unit = self.ranges[shard_index] if self.ranges is not None else None
            position = unit.position if unit is not None else shard_index
            # NOTE: with a deferred identity the fingerprint and settings are filled in before the first commit
            fingerprint = self.fingerprints[position] if self.fingerprints is not None else ""
            self._writers[shard_index] = self.store.writer(
                self.shards[position], fingerprint, self.settings or {}, self.dim,
                unit if unit is not None and not unit.whole else None)
            self._positions[shard_index] = position
        return self._writers[shard_index]

    def _settle(self) -> None:
        """Resolve a deferred identity (once) and give every open writer its fingerprint and settings."""
        if self._deferred is None:
            return
        self.fingerprints, self.settings = self._deferred.resolve()
        self._deferred = None
        for index, writer in self._writers.items():
            writer.fingerprint = self.fingerprints[self._positions[index]]
            writer.settings = self.settings

    def expect(self, shard_index: int, num_docs: int, rejects: list[tuple[int, str]], truncated_rows: Sequence[int],
               final: bool, claimed: Sequence[tuple[int, Any]] = ()) -> list[tuple[int, StoreEntry]]:
        """Note a tokenized chunk: ``num_docs`` will come back from the engine; ``truncated_rows``: its rows cut at
        the model's max length; ``claimed``: ``(row, id)`` of its ``rejects`` whose id the read checks had taken."""
        writer = self._writer(shard_index)
        writer.reject(rejects, claimed)
        writer.truncated(truncated_rows)
        writer.pending += num_docs
        writer.input_done = writer.input_done or final
        return self._commit_ready()

    def add(self, keys: list[tuple[int, int, Any]], vectors: np.ndarray,
            tokens: np.ndarray | None = None) -> list[tuple[int, StoreEntry]]:
        """Vectors of one step; ``keys[i] = (shard_index, row, doc_id)`` of ``vectors[i]`` (model vectors,
        stored as ``transform.stored(vectors)`` when the sink has a transform); ``tokens[i]``: its token count."""
        if self.transform is not None:
            vectors = self.transform.stored(vectors)
        shards = [key[0] for key in keys]
        if shards[0] == shards[-1] and len(set(shards)) == 1:  # the common case: one shard per step
            groups = {shards[0]: list(range(len(keys)))}
        else:
            groups = {}
            for i, shard_index in enumerate(shards):
                groups.setdefault(shard_index, []).append(i)
        for shard_index, positions in groups.items():
            writer = self._writers[shard_index]
            whole = len(positions) == len(keys)
            writer.add([keys[i][1] for i in positions], [keys[i][2] for i in positions],
                       vectors if whole else vectors[positions],
                       None if tokens is None else tokens if whole else tokens[positions])
            writer.pending -= len(positions)
        return self._commit_ready()

    def _commit_ready(self) -> list[tuple[int, StoreEntry]]:
        committed = []
        ready = [i for i, w in self._writers.items() if w.ready]
        if ready:
            self._settle()
        for i in ready:
            writer = self._writers.pop(i)
            self._positions.pop(i, None)
            try:
                committed.append((i, writer.commit()))
            except BaseException:
                writer.abort()  # a failed commit (disk full) frees its space at once
                raise
        return committed

    def abort(self) -> None:
        """Drop every uncommitted shard (their rows will be embedded again by the next run)."""
        for writer in self._writers.values():
            writer.abort()
        self._writers.clear()
