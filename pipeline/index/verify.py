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
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from petal.pipeline.index.checksums import (
    CHECKSUM_KEY,
    HEAD_TAIL_BYTES,
    INTEGRITY_KEY,
    MANIFEST_FILE,
    canonical_sha256,
    head_tail_sha256_of,
    sha256_file,
)
from petal.pipeline.layout import denied, is_denied
from petal.pipeline.manifest import raw_checksum, raw_index_files, raw_integrity
from petal.pipeline.reliability.errors import (
    EXIT_CONFIG,
    EXIT_DATAERR,
    EXIT_OK,
    BadInputError,
    ConfigError,
    one_line,
    quote_path,
    quote_text,
)
from petal.pipeline.reliability.safe_files import UnsafeFileError, check_regular, open_regular, read_regular

REQUIRED_FILES = ("index.faiss", "ids.parquet")
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


def read_raw_manifest(version_dir: Path) -> dict[str, Any]:
    """``manifest.json`` as written (the checksums cover these bytes, not a typed reading of them)."""
    path = version_dir / MANIFEST_FILE
    try:
        data = json.loads(read_regular(path, version_dir).decode("utf-8"))  # NOTE: never a FIFO or a link out
    except UnsafeFileError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {quote_path(path)}: {one_line(str(exc))}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{quote_path(path)}: the manifest is {type(data).__name__}, expected an object")
    return data


def _expected(manifest: dict[str, Any], version_dir: Path) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """``(index files -> sha256, file -> integrity record)`` from the manifest."""
    files = raw_index_files(manifest)
    integrity = raw_integrity(manifest)
    records = integrity.get("files", {}) if isinstance(integrity, dict) else {}
    if not isinstance(files, dict) or not isinstance(records, dict):
        raise BadInputError(f"{version_dir / MANIFEST_FILE}: index.files or {INTEGRITY_KEY}.files is not a mapping")
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
    files, records = _expected(manifest, version_dir)
    edited: str | None = None
    try:
        sealed = check_manifest_checksum(version_dir, manifest)
    except BadInputError as exc:
        # NOTE: a manifest changed after it was written (by hand, or damaged) cannot vouch for the cheap
        # records: every listed file is checked in full against its sha256 instead, as before issue 14,
        # and the open says so; petal verify exits 65 on it.
        sealed, records, edited = False, {}, str(exc)
    span = checked_records(version_dir, manifest, files, records) if records else HEAD_TAIL_BYTES
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
        elif not full_fallback:
            unchecked.append(name)
        else:  # NOTE: an old version: its sha256 is the only record, so the check stays the full one
            _check_sha256(path, expected)
            if size > 2 * HEAD_TAIL_BYTES:
                read_in_full.append(name)
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
class FileVerdict:
    name: str
    ok: bool
    problem: str = ""  # what is wrong: missing, size, sha256
    refused: bool = False  # missing, not a regular file inside the version, not listed: what opening refuses (78)


@dataclass(frozen=True)
class VerifyReport:
    """``petal verify``: every byte of every listed file against its recorded sha256."""

    version_dir: Path
    manifest_checksum: str  # "ok", "absent" (an old version) or the problem
    files: tuple[FileVerdict, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.manifest_checksum in ("ok", "absent") and all(f.ok for f in self.files)

    @property
    def exit_code(self) -> int:
        """0 when whole; 78 when a file is refused (the code opening the version exits with: it places every
        file before it checks any), else 65 (a file or the manifest does not match its checksum)."""
        if self.ok:
            return EXIT_OK
        return EXIT_CONFIG if any(f.refused for f in self.files) else EXIT_DATAERR

    def as_dict(self) -> dict[str, Any]:
        return {"version_dir": str(self.version_dir), "ok": self.ok, "exit_code": self.exit_code,
                "manifest_checksum": self.manifest_checksum,
                "files": [{"name": f.name, "ok": f.ok, **({"problem": f.problem} if f.problem else {})}
                          for f in self.files]}


def verify_version(version_dir: Path, manifest: dict[str, Any] | None = None) -> VerifyReport:
    """Check the manifest's checksum and the full sha256 (and size) of every file it lists
    (``manifest``: the raw manifest, default: read from ``version_dir``)."""
    manifest = read_raw_manifest(version_dir) if manifest is None else manifest
    try:
        manifest_state = "ok" if check_manifest_checksum(version_dir, manifest) else "absent"
    except BadInputError as exc:
        manifest_state = str(exc)
    files, records = _expected(manifest, version_dir)
    if manifest_state == "ok" and records:
        checked_records(version_dir, manifest, files, records)  # NOTE: what opening refuses (78), verify refuses
    elif manifest_state != "ok":
        # NOTE: the records of a manifest that does not match its own checksum were never checked: one that is no
        # object cannot name a sha256 (its file is checked by index.files, as the open does, or not at all); the
        # manifest's mismatch is already the verdict (65)
        records = {name: r for name, r in records.items() if isinstance(r, dict)}
    expected = {name: str(sha) for name, sha in files.items()}
    expected.update({name: str(r.get("sha256")) for name, r in records.items() if r.get("sha256")})
    verdicts = [FileVerdict(name, False, "not listed in the manifest", refused=True) for name in REQUIRED_FILES
                if name not in expected]
    for name, sha in sorted(expected.items()):
        verdicts.append(_verify_file(version_dir, name, sha, records.get(name)))
    return VerifyReport(version_dir, manifest_state, tuple(verdicts))


def _verify_file(version_dir: Path, name: str, sha: str, record: dict[str, Any] | None) -> FileVerdict:
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
    return FileVerdict(name, True)
