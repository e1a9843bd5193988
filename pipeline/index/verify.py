"""Checking a version's files: cheaply when it opens (O(1) in its size), every byte in ``petal verify``.

On open: the manifest's own checksum, the name, size and head/tail checksum of every file its
records list (``pipeline/index/checksums.py``; ``rejects.parquet`` included). A version written
before those records existed (a manifest with sha256 values only), or whose manifest no longer
matches its own checksum (edited or damaged), is checked as every version was before: every
byte of every file against its sha256, safe but O(size); ``OpenCheck.note`` says so, and
``petal verify`` exits 65 on an edited manifest.

Both rank a version's damage the same way: a listed file that cannot be opened as a regular file inside
the version (missing, a directory, a FIFO, a symlink out of it, a name that is not a plain file name) or a
required file the manifest does not list is refused with 78, before any checksum; a file that is there
but does not match its records (size, head/tail, sha256: a zero-byte file too) is 65.

Checksums cannot tell a manifest signed again over other files (another valid FAISS index put in its place)
from the one petal wrote: both also read ``index.faiss``'s header (its first bytes, without FAISS: O(1)) and
refuse one whose dimension, vector count, metric or binary/float kind is not the manifest's (65 naming the file
and the field); ``petal verify`` also reads the index as opening does (``mmap.py``: never a path recorded inside
it) and compares its structure (index types, lists, code sizes) with the manifest's factory, and the id count,
and that every vector of an HNSW graph is reached by a walk from its entry point (``graph_repair.py``).
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from petal.pipeline.index.checksums import (
    CHECKSUM_KEY,
    HEAD_TAIL_BYTES,
    INTEGRITY_KEY,
    MANIFEST_FILE,
    MAX_HEAD_TAIL_BYTES,
    canonical_sha256,
    head_tail_sha256_of,
    sha256_file,
)
from petal.pipeline.layout import VersionLease, current_pointer, denied, is_denied, resolve_index_dir
from petal.pipeline.manifest import Manifest, raw_checksum, raw_index_files, raw_integrity
from petal.pipeline.reliability.errors import (
    EXIT_CONFIG,
    EXIT_DATAERR,
    EXIT_OK,
    BadInputError,
    ConfigError,
    PetalError,
    TemporaryFailure,
    one_line,
    quote_path,
    quote_text,
)
from petal.pipeline.reliability.faults import fault
from petal.pipeline.reliability.safe_files import UnsafeFileError, check_regular, open_regular, read_regular

REQUIRED_FILES = ("index.faiss", "ids.parquet")
INDEX_FILE, IDS_FILE = REQUIRED_FILES
FAISS_METRICS = {0: "ip", 1: "l2"}  # FAISS's METRIC_INNER_PRODUCT, METRIC_L2
# NOTE: FAISS's write_index_header after the 4-byte type tag: d int32, ntotal int64, two int64 fields it ignores,
# is_trained bool, metric_type int32 (little-endian, packed); a binary index's: d, code_size int32, ntotal int64
FLOAT_HEADER = struct.Struct("<iqqq?i")
BINARY_HEADER = struct.Struct("<iiq")
SAFE_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class OpenCheck:
    """What was checked when a version opened."""

    version_dir: Path
    sealed: bool  # the manifest has head/tail records and its own checksum, which matched
    read_in_full: tuple[str, ...] = ()  # files larger than 2 head/tail spans hashed whole (no trusted records)
    manifest_problem: str | None = None  # the manifest does not match its own checksum
    unchecked: tuple[str, ...] = ()  # files without trusted records, not hashed (``full_fallback=False``)

    @property
    def note(self) -> str | None:
        if self.manifest_problem is not None:
            return f"{self.manifest_problem}; every file was checked in full against its sha256 instead"
        if not self.read_in_full:
            return None
        return (f"{self.version_dir} was written before head/tail checksums existed: {', '.join(self.read_in_full)} "
                "read in full to check them (O(size) per open); petal rebuild writes a version that opens in O(1)")


OPEN_ATTEMPTS = 3


def open_leased(path: Path) -> tuple[Path, Manifest, VersionLease]:
    """``resolve_index_dir(path)`` (OUT: the version CURRENT names; or a version directory) with a lease on the
    version (``VersionLease``) for the caller to release once it has read the files (``petal verify``, ``petal
    info``): a publish that prunes it meanwhile (``--keep-versions``) leaves it on disk, as it does under a query.
    Pruned between reading CURRENT and taking the lease: the version CURRENT names now; gone for good (a version
    directory given, or CURRENT unchanged): ``TemporaryFailure`` (75)."""
    for attempt in range(1, OPEN_ATTEMPTS + 1):
        pointer = current_pointer(path)
        try:
            version_dir, manifest = resolve_index_dir(path)
            try:
                lease = VersionLease(version_dir)
            except FileNotFoundError as exc:
                raise TemporaryFailure(f"{quote_path(version_dir)} was deleted while it was opened (re-indexing?); "
                                       "retry") from exc
        except (OSError, PetalError):
            # NOTE: a writer can publish a new version and prune this one between our reading CURRENT and its files
            if attempt == OPEN_ATTEMPTS or current_pointer(path) == pointer:
                raise
            continue
        fault("query_open", version_dir)  # NOTE: leased: a sleep here lets a writer publish and prune meanwhile
        return version_dir, manifest, lease
    raise AssertionError("unreachable")


def read_raw_manifest(version_dir: Path) -> dict[str, Any]:
    """``manifest.json`` as written (the checksums cover these bytes, not a typed reading of them)."""
    path = version_dir / MANIFEST_FILE
    try:
        data = json.loads(read_regular(path, version_dir).decode("utf-8"))  # NOTE: never a FIFO or a link out
    except UnsafeFileError:
        raise
    except (OSError, ValueError, RecursionError) as exc:  # NOTE: '[[[[...' too deep; a 4,301-digit int
        from petal.pipeline.index.read_errors import host_os_error

        failed = host_os_error(path, exc) if isinstance(exc, OSError) else None  # NOTE: EIO, EMFILE...: 74, not 78
        raise failed or ConfigError(f"cannot read {quote_path(path)}: {one_line(str(exc))}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{quote_path(path)}: the manifest is {type(data).__name__}, expected an object")
    return data


def _expected(manifest: dict[str, Any], version_dir: Path,
              sealed: bool) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """``(index files -> sha256, file -> integrity record)`` from the manifest. ``sealed`` (it matches its own
    checksum): the records must be petal's, ``integrity`` and ``integrity.files`` objects (``ConfigError``, 78, naming
    the key, as ``checked_records``); otherwise they vouch for nothing (an edited manifest: the records that are
    objects, for ``petal verify`` to name; an old version has none) and are never refused for their shape."""
    files = raw_index_files(manifest)
    if not isinstance(files, dict):
        raise BadInputError(f"{version_dir / MANIFEST_FILE}: index.files is not a mapping")
    integrity = raw_integrity(manifest)
    records = integrity.get("files") if isinstance(integrity, dict) else None
    if not sealed:
        return files, {name: r for name, r in records.items() if isinstance(r, dict)} if isinstance(records, dict) \
            else {}
    where = f"{quote_path(version_dir / MANIFEST_FILE)}: manifest key"
    # NOTE: petal seals a manifest with its records (checksums.py): a signed manifest without them, or with records
    # of another shape, was edited and signed again; it must not open as a version written before records existed
    if not isinstance(integrity, dict):
        found = "missing" if integrity is None else f"{type(integrity).__name__} {quote_text(repr(integrity), 24)}"
        raise ConfigError(f"{where} {INTEGRITY_KEY} is {found}, expected an object (the manifest carries "
                          f"{CHECKSUM_KEY}: petal writes both); rebuild the index")
    if not isinstance(records, dict):
        found = "missing" if records is None else f"{type(records).__name__} {quote_text(repr(records), 24)}"
        raise ConfigError(f"{where} {INTEGRITY_KEY}.files is {found}, expected an object; rebuild the index")
    return files, records


_HEX64 = re.compile(r"[0-9a-f]{64}")


def checked_records(version_dir: Path, manifest: dict[str, Any], files: dict[str, Any],
                    records: dict[str, Any]) -> int:
    """The head/tail span of a sealed manifest's ``integrity`` records (non-empty), each record's fields
    checked (a sealed manifest is petal's own: a wrong type or a missing record means it was edited and signed
    again, or petal wrote it wrong): ``ConfigError`` (78) naming the key."""
    where = f"{quote_path(version_dir / MANIFEST_FILE)}: manifest key {INTEGRITY_KEY}"
    span = raw_integrity(manifest).get("head_tail_bytes", HEAD_TAIL_BYTES)
    if isinstance(span, bool) or not isinstance(span, int) or span < 1:
        raise ConfigError(f"{where}.head_tail_bytes is {quote_text(repr(span), 24)}, expected a positive integer; "
                          "rebuild the index")
    if span > MAX_HEAD_TAIL_BYTES:  # NOTE: it sizes every open's reads: 2^60 would hash whole files at each open
        raise ConfigError(f"{where}.head_tail_bytes is {quote_text(repr(span), 24)}, expected at most "
                          f"{MAX_HEAD_TAIL_BYTES} (petal writes {HEAD_TAIL_BYTES}); rebuild the index")
    for name, record in records.items():
        if not isinstance(record, dict):
            raise ConfigError(f"{where}.files.{_named(name)} is {type(record).__name__}, expected an object")
        size = record.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ConfigError(f"{where}.files.{_named(name)}.size is {quote_text(repr(size), 24)}, "
                              "expected a byte count; rebuild the index")
        for key in ("sha256", "head_tail_sha256"):
            value = record.get(key)
            if not isinstance(value, str) or not _HEX64.fullmatch(value):
                raise ConfigError(f"{where}.files.{_named(name)}.{key} is {quote_text(repr(value), 24)}, "
                                  "expected 64 hex digits; rebuild the index")
    missing = sorted(name for name in files if name not in records)
    if missing:
        raise ConfigError(f"{where}.files has no record of {', '.join(map(_named, missing))}, which "
                          "index.files lists: the manifest was edited; rebuild the index")
    return span


def _named(name: Any) -> str:
    """A file name of the manifest as a message shows it: plain, or quoted when it is not a plain name."""
    return name if isinstance(name, str) and SAFE_FILE_NAME.match(name) else quote_text(str(name))


def check_manifest_checksum(version_dir: Path, manifest: dict[str, Any]) -> bool:
    """``True`` when the manifest carries its checksum and it matches; ``False`` for an old manifest without one."""
    recorded = raw_checksum(manifest)
    if recorded is None:
        if raw_integrity(manifest) is not None:  # records without the checksum that vouches for them
            raise BadInputError(f"{version_dir / MANIFEST_FILE} has {INTEGRITY_KEY} records but no {CHECKSUM_KEY}: "
                                "it was edited or is corrupt; rebuild the index (petal verify checks every file)")
        return False
    if recorded != canonical_sha256(manifest):
        raise BadInputError(f"{version_dir / MANIFEST_FILE} does not match its own checksum ({CHECKSUM_KEY}): "
                            "it was edited or is corrupt; rebuild the index (petal verify checks every file)")
    return True


def check_on_open(version_dir: Path, manifest: dict[str, Any] | None = None, *,
                  full_fallback: bool = True) -> OpenCheck:
    """The cheap checks before FAISS reads anything; raises ``BadInputError`` (65) / ``ConfigError`` (78).

    ``manifest``: the raw manifest (default: read from ``version_dir``). ``full_fallback=False`` (``petal info``):
    files without trusted head/tail records are only checked to be there and regular, not hashed in full
    (``OpenCheck.unchecked`` names them).
    """
    manifest = read_raw_manifest(version_dir) if manifest is None else manifest
    edited: str | None = None
    try:
        sealed = check_manifest_checksum(version_dir, manifest)
    except BadInputError as exc:
        # NOTE: a manifest changed after it was written (by hand, or damaged) cannot vouch for the cheap
        # records: every listed file is checked in full against its sha256 instead, as before issue 14,
        # and the open says so; petal verify exits 65 on it.
        sealed, edited = False, str(exc)
    files, records = _expected(manifest, version_dir, sealed)
    if not sealed:
        records = {}
    span = checked_records(version_dir, manifest, files, records) if sealed else HEAD_TAIL_BYTES
    for name in REQUIRED_FILES:
        if name not in files:
            raise ConfigError(f"{version_dir}: {name} is not listed in the manifest")
    # NOTE: every file the sealed records list (rejects.parquet too, not only the index files): a truncated or
    # swapped file of the version is refused at open, whichever it is
    listed = {**{name: str(r.get("sha256")) for name, r in records.items()}, **files}
    # NOTE: every file placed (78: missing, not a regular file, outside the version) before any is checksummed
    # (65), so a version with both kinds of damage is refused as petal verify ranks it, whatever the file order
    paths = {name: _listed_path(version_dir, name) for name in sorted(listed)}
    read_in_full: list[str] = []
    unchecked: list[str] = []
    for name, path in paths.items():
        expected = listed[name]
        size = path.stat().st_size
        record = records.get(name)
        if record is not None:
            if size != record.get("size"):
                raise BadInputError(f"{path}: size {size} does not match the manifest ({record.get('size')} bytes); "
                                    "the index is corrupt or was changed, rebuild it")
            if _head_tail(path, version_dir, size, span) != record.get("head_tail_sha256"):
                raise BadInputError(f"{path}: head/tail checksum does not match the manifest; the index is corrupt "
                                    "or was changed, rebuild it")
        elif not full_fallback:  # NOTE: not hashed, but opened: a file petal may not read is 66 (denied), as in query
            os.close(_readable(open_regular, path, version_dir))
            unchecked.append(name)
        else:  # NOTE: an old version: its sha256 is the only record, so the check stays the full one
            _check_sha256(path, expected)
            if size > 2 * HEAD_TAIL_BYTES:
                read_in_full.append(name)
    problem = header_problem(version_dir, manifest)
    if problem is not None:
        raise BadInputError(problem)
    return OpenCheck(version_dir, sealed and bool(records), tuple(read_in_full), edited, tuple(unchecked))


def _listed_path(version_dir: Path, name: str) -> Path:
    if not SAFE_FILE_NAME.match(name):  # NOTE: a manifest must not point outside its directory (78, as a link out)
        raise ConfigError(f"{quote_path(version_dir)}: the manifest lists {quote_text(name)}, which is not a "
                            "plain file name")
    path = version_dir / name
    try:
        check_regular(path, version_dir)  # NOTE: never follow a symlink out, never block on a FIFO
    except FileNotFoundError:
        raise ConfigError(f"{quote_path(version_dir)}: {name} is listed in the manifest but missing") from None
    return path


def _head_tail(path: Path, version_dir: Path, size: int, span: int) -> str:
    """``head_tail_sha256`` read through a descriptor opened without blocking (a file swapped for a FIFO
    after ``_listed_path`` is refused, never waited on)."""
    fd = _readable(open_regular, path, version_dir)
    with os.fdopen(fd, "rb") as fh:
        return head_tail_sha256_of(fh, size, span)


def _readable(read: Any, path: Path, *args: Any) -> Any:
    """``read(path, *args)``; a file this process may not read is no input (66, ``layout.denied``) naming it."""
    try:
        return read(path, *args)
    except OSError as exc:
        if is_denied(exc):
            raise denied(path) from exc
        raise


def _check_sha256(path: Path, expected: str) -> None:
    actual = _readable(sha256_file, path)
    if actual != expected:
        raise BadInputError(f"{path}: sha256 {actual[:16]}... does not match the manifest ({str(expected)[:16]}...); "
                            "the index is corrupt, rebuild it")


@dataclass(frozen=True)
class IndexHeader:
    """What the first bytes of ``index.faiss`` say, read without FAISS."""

    tag: str  # FAISS's 4-byte type tag ("IxFI": a flat inner-product index, "IwFl": IVF-Flat, "IBxF": binary flat)
    binary: bool
    dim: int  # dimensions (bits for a binary index)
    ntotal: int
    metric: str | None  # "ip", "l2" (another FAISS metric: its number); None for a binary index (Hamming)


def read_index_header(path: Path, version_dir: Path) -> IndexHeader:
    """The header of the FAISS index at ``path`` (opened as every file of a version: never a FIFO or a link out);
    too short to hold one: ``BadInputError`` (65) naming it."""
    fd = _readable(open_regular, path, version_dir)
    with os.fdopen(fd, "rb") as fh:
        head = fh.read(4 + FLOAT_HEADER.size)
    binary = head[:2] == b"IB"
    layout = BINARY_HEADER if binary else FLOAT_HEADER
    if len(head) < 4 + layout.size:
        raise BadInputError(f"{quote_path(path)}: {len(head)} bytes, too short for a FAISS index header; the version "
                            "is damaged, run petal verify and rebuild it")
    tag = head[:4].decode("latin-1")
    if binary:
        dim, _, ntotal = layout.unpack_from(head, 4)
        return IndexHeader(tag, True, dim, ntotal, None)
    dim, ntotal, _, _, _, metric = layout.unpack_from(head, 4)
    return IndexHeader(tag, False, dim, ntotal, FAISS_METRICS.get(metric, str(metric)))


def binary_index(manifest: dict[str, Any]) -> bool:
    """The raw manifest's index is binary (Hamming codes, float rescoring): ``--quantize binary``, or one of FAISS's
    binary factories over float output (``--index-factory BFlat``, ``BIVF...``: the writer builds what the factory
    makes, so its kind is the factory's, not the output's)."""
    from petal.pipeline.index.plan import is_binary

    index, output = _mapping(manifest.get("index")), _mapping(manifest.get("output"))
    factory = index.get("factory")
    return output.get("quantize") == "binary" or (isinstance(factory, str) and is_binary(factory))


def header_problem(version_dir: Path, manifest: dict[str, Any]) -> str | None:
    """Why ``index.faiss``'s header does not match the manifest (``None`` when it does): a binary index under a
    float manifest or the reverse, another dimension, vector count or metric. Each field is compared where the
    manifest holds a value of its type (a typed reading of the manifest refuses the others, 78)."""
    path = version_dir / INDEX_FILE
    header = read_index_header(path, version_dir)
    index = _mapping(manifest.get("index"))
    binary = binary_index(manifest)
    kinds = {True: "binary (Hamming)", False: "float"}
    wrong = [] if header.binary == binary else [f"a {kinds[header.binary]} index ({header.tag}), the manifest a "
                                                 f"{kinds[binary]} one"]
    for name, found, expected in (("dim", header.dim, manifest.get("dim")),
                                  ("ntotal", header.ntotal, index.get("num_vectors")),
                                  ("metric", header.metric, None if header.binary else index.get("metric"))):
        if isinstance(expected, type(found)) and not isinstance(expected, bool) and found != expected:
            key = {"dim": "dim", "ntotal": "index.num_vectors", "metric": "index.metric"}[name]
            wrong.append(f"{name} {found}, the manifest ({key}) {expected}")
    if not wrong:
        return None
    return (f"{quote_path(path)}: its FAISS header says {'; '.join(wrong)}: the index does not match its manifest "
            "(the file was replaced or the manifest rewritten); the version is damaged, rebuild it")


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class FileVerdict:
    """One file of a version, as ``petal verify`` (``petal.verify``) found it."""

    name: str
    ok: bool
    problem: str = ""  # what is wrong: missing, size, sha256
    refused: bool = False  # missing, not a regular file inside the version, not listed: what opening refuses (78)


@dataclass(frozen=True)
class VerifyReport:
    """``petal verify`` (``petal.verify``): every byte of every listed file against its recorded sha256. ``ok``: the
    whole version matches; ``exit_code``: the command's (0, 65, 78); ``files``: a ``FileVerdict`` per file."""

    version_dir: Path
    manifest_checksum: str  # "ok", "absent" (an old version) or the problem
    files: tuple[FileVerdict, ...] = field(default_factory=tuple)
    # NOTE: the id the manifest records, as petal info --json names it: a version copied out (/srv/index) keeps its id
    version: str = ""

    @property
    def ok(self) -> bool:
        """Every file and the manifest's own checksum match (a manifest older than its checksum: ``absent``)."""
        return self.manifest_checksum in ("ok", "absent") and all(f.ok for f in self.files)

    @property
    def exit_code(self) -> int:
        """0 when whole; 78 when a file is refused (the code opening the version exits with: it places every
        file before it checks any), else 65 (a file or the manifest does not match its checksum)."""
        if self.ok:
            return EXIT_OK
        return EXIT_CONFIG if any(f.refused for f in self.files) else EXIT_DATAERR

    def as_dict(self) -> dict[str, Any]:
        """The report as ``petal verify --json`` prints it (plain JSON types)."""
        # NOTE: "version" as petal info --json has it (before: only version_dir, a path to take the id from)
        return {"version": self.version, "version_dir": str(self.version_dir), "ok": self.ok,
                "exit_code": self.exit_code, "manifest_checksum": self.manifest_checksum,
                "files": [{"name": f.name, "ok": f.ok, **({"problem": f.problem} if f.problem else {})}
                          for f in self.files]}


def verify_version(version_dir: Path, manifest: dict[str, Any] | None = None, *,
                   read_index: bool = False) -> VerifyReport:
    """Check the manifest's checksum, the full sha256 (and size) of every file it lists and ``index.faiss``'s header
    against the manifest (``manifest``: the raw manifest, default: read from ``version_dir``). ``read_index``
    (``petal verify``): when every file matches, also read the index as opening does (``index_problems``), and a
    sealed version's entries that the manifest does not list (a file, directory or link put there) are 65 by name."""
    manifest = read_raw_manifest(version_dir) if manifest is None else manifest
    try:
        manifest_state = "ok" if check_manifest_checksum(version_dir, manifest) else "absent"
    except BadInputError as exc:
        manifest_state = str(exc)
    # NOTE: the records of a manifest that does not match its own checksum were never checked: one that is no
    # object cannot name a sha256 (its file is checked by index.files, as the open does, or not at all); the
    # manifest's mismatch is already the verdict (65)
    files, records = _expected(manifest, version_dir, manifest_state == "ok")
    span: int | None = None  # the head/tail records are checked only where opening checks them: a sealed manifest's
    if manifest_state == "ok":
        span = checked_records(version_dir, manifest, files, records)  # NOTE: what opening refuses (78), verify too
    # NOTE: index.files' sha256 over the record's where both name a file, as the open lists them: a manifest re-signed
    # with another value there (the records' right) said OK
    expected = {name: str(r.get("sha256")) for name, r in records.items() if r.get("sha256")}
    expected.update({name: str(sha) for name, sha in files.items()})
    # NOTE: listed in index.files, as the open requires (78): a sealed version's integrity records alone do not list
    # an index file (a manifest re-signed without it: every open refused it, verify said OK)
    unlisted = [name for name in REQUIRED_FILES if name not in files]
    verdicts = [FileVerdict(name, False, "not listed in the manifest", refused=True) for name in unlisted]
    for name, sha in sorted(expected.items()):
        if name in unlisted:
            continue
        verdicts.append(_verify_file(version_dir, name, sha, records.get(name), span))
    if all(f.ok for f in verdicts):  # NOTE: every file is the one the manifest signs: does it hold what it says?
        problems = {INDEX_FILE: problem} if (problem := header_problem(version_dir, manifest)) is not None \
            else index_problems(version_dir, manifest) if read_index else {}
        verdicts = [FileVerdict(f.name, False, problems[f.name]) if f.name in problems else f for f in verdicts]
    if read_index and span is not None:  # NOTE: a sealed version holds its listed files and manifest.json, no other
        verdicts += [FileVerdict(_named(name), False, "not written by petal: the manifest does not list it")
                     for name in _unlisted(version_dir, expected)]
    recorded = manifest.get("version") if isinstance(manifest, dict) else None
    return VerifyReport(version_dir, manifest_state, tuple(verdicts),
                        recorded if isinstance(recorded, str) else version_dir.name)


def _unlisted(version_dir: Path, expected: dict[str, str]) -> list[str]:
    """The entries of ``version_dir`` (files, directories, links: never followed) other than ``manifest.json`` and
    the files the manifest lists, sorted."""
    names = _readable(os.listdir, version_dir)
    return sorted(name for name in names if name != MANIFEST_FILE and name not in expected)


def index_problems(version_dir: Path, raw: dict[str, Any]) -> dict[str, str]:
    """What reading the version as opening does finds wrong, by file name: ``index.faiss`` that FAISS cannot read
    the safe way (``mmap.py``: never a path recorded inside it; the structure checks of ``structure.py``) or whose
    structure is not the manifest's factory's, ``rescore.npy`` (binary) or ``ids.parquet`` not of its vectors' count.
    ``petal verify`` only: it imports FAISS and pyarrow."""
    from petal.pipeline.index.binary import RESCORE_FILE, open_binary_index
    from petal.pipeline.index.faiss_loader import load_faiss
    from petal.pipeline.index.files import read_index as read_faiss
    from petal.pipeline.index.plan import make_index
    from petal.pipeline.manifest import Manifest

    faiss = load_faiss()
    manifest = Manifest.from_dict(raw, quote_path(version_dir / MANIFEST_FILE))
    record = manifest.index
    binary = binary_index(raw)
    path = version_dir / INDEX_FILE
    try:
        index = open_binary_index(version_dir, manifest).index if binary else read_faiss(path, record.storage)
    except BadInputError as exc:
        return {RESCORE_FILE if RESCORE_FILE in str(exc) and binary else INDEX_FILE: str(exc)}
    except (RuntimeError, MemoryError) as exc:
        from petal.pipeline.index.read_errors import host_failure, read_failure

        if host_failure(exc) is not None:  # NOTE: the host failed the read (74): no verdict on the file
            raise read_failure(path, "it with FAISS", exc) from exc
        return {INDEX_FILE: f"FAISS cannot read it ({one_line(str(exc)).strip()[:200]})"}
    try:
        fresh = make_index(record.factory, manifest.dim, record.metric)
    except ValueError as exc:
        return {INDEX_FILE: f"the manifest's index.factory {quote_text(record.factory)} is not one FAISS builds "
                            f"({one_line(str(exc))[:200]})"}
    # NOTE: the empty index the factory makes, written and read back: FAISS's reader picks the classes (IndexFlatIP
    # for a factory's IndexFlat), as it did for the version's file
    found = _structure(faiss, index)
    try:
        fresh = faiss.deserialize_index_binary(faiss.serialize_index_binary(fresh)) if binary \
            else faiss.deserialize_index(faiss.serialize_index(fresh))
        made = _structure(faiss, fresh)
    except TypeError:
        # NOTE: a float index the factory makes where the version's output is binary (a manifest naming Flat on a
        # binary index): the binary writer refused it (a traceback, exit 1); its structure differs from the file's
        made = _structure(faiss, fresh)
    except RuntimeError:
        # NOTE: FAISS cannot read back some untrained indexes it writes (an additive quantizer's empty codebooks:
        # RQ4x8, a traceback from petal verify): their shapes are compared without the class names the reader picks
        made = _structure(faiss, fresh)
        if [part[1:] for part in found] == [part[1:] for part in made]:
            made = found
    if found != made:
        return {INDEX_FILE: f"FAISS reads {_described(found)}, the manifest's index.factory "
                            f"{quote_text(record.factory)} makes {_described(made)}: the index does not match its "
                            "manifest (the file was replaced or the manifest rewritten)"}
    try:
        ids = _decoded_ids(version_dir / IDS_FILE, manifest)
    except BadInputError as exc:
        return {IDS_FILE: str(exc)}
    if ids != index.ntotal:
        return {IDS_FILE: f"maps {ids} ids for the {index.ntotal} vectors of {INDEX_FILE}"}
    from petal.pipeline.index.graph_repair import unreached_nodes

    # NOTE: a graph written before graph_repair.py linked every node (duplicate documents cut whole groups off) passed
    # every check above while no search could return those documents
    lost = unreached_nodes(index)
    if lost:
        return {INDEX_FILE: f"{lost} of the {index.ntotal} vectors of its HNSW graph are reached by no search (no "
                            "link leads to them from the graph's entry point), so their documents are in no query's "
                            "hits; petal rebuild OUT writes a version that links every vector"}
    return {}


def _decoded_ids(path: Path, manifest: Any) -> int:
    """The ids ``path`` (``ids.parquet``) maps, read as searches read it (its id columns there) and every row group
    decoded, page checksums verified, one at a time: ``BadInputError`` (65) naming it otherwise.
    NOTE: its sha256 only says it is the file the manifest signs; a manifest signed again over a file whose pages
    do not decode made every query 65 ('run petal verify') while petal verify said ok."""
    from petal.pipeline.index.open_checks import open_ids

    rows, _ = open_ids(path.parent, manifest, None)  # the columns a hit needs, and those the manifest says are stored
    for group in range(len(rows.starts) - 1):
        rows.read_group(group, rows.names)
    return rows.num_rows


def _structure(faiss: Any, index: Any) -> tuple[tuple[str, int, int | None, int | None], ...]:
    """Each index inside ``index`` (``mmap.index_parts``: quantizers, wrapped indexes...): its class, dimension,
    inverted lists and code size, which a factory string fixes (not the vectors it holds)."""
    from petal.pipeline.index.mmap import index_parts

    return tuple((type(part).__name__, int(part.d), int(part.nlist) if hasattr(part, "nlist") else None,
                  int(part.code_size) if hasattr(part, "code_size") else None) for part in index_parts(faiss, index))


def _described(structure: tuple[tuple[str, int, int | None, int | None], ...]) -> str:
    return " over ".join(f"{name}(d={dim}" + (f", {nlist} lists" if nlist is not None else "")
                         + (f", {code} bytes per code" if code is not None else "") + ")"
                         for name, dim, nlist, code in structure)


def _verify_file(version_dir: Path, name: str, sha: str, record: dict[str, Any] | None,
                 span: int | None = None) -> FileVerdict:
    try:
        path = _listed_path(version_dir, name)
    except ConfigError as exc:  # NOTE: missing or not a regular file inside the version: opening refuses it (78)
        return FileVerdict(name, False, str(exc), refused=True)
    size = path.stat().st_size
    if record is not None and size != record.get("size"):
        return FileVerdict(name, False, f"size {size} bytes, the manifest says {record.get('size')}")
    actual = _readable(sha256_file, path)
    if actual != sha:
        return FileVerdict(name, False, f"sha256 {actual[:16]}... does not match the manifest ({sha[:16]}...)")
    # NOTE: the record opening checks (``span``: a sealed manifest's, whose records were checked): a file whose
    # sha256 matches but whose head/tail record does not is refused by every open (65), so verify must not say ok
    if span is not None and record is not None \
            and _head_tail(path, version_dir, size, span) != record.get("head_tail_sha256"):
        return FileVerdict(name, False, "its head/tail checksum does not match the manifest's record, which opening "
                                        "checks (65 at every open); rebuild the index")
    return FileVerdict(name, True)
