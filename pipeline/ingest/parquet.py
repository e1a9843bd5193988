"""Finding Parquet shards, checking every footer and schema up front, streaming their rows.

Rows are read with ``ParquetFile.iter_batches`` (never a whole shard), only the id and text
columns (by their exact top-level names: ``exact_columns.py``), pages streamed through a small buffer
(never a whole row group) and record batches sized from the footer's byte counts, so host memory grows
neither with shard size nor row-group size.
NOTE: it does grow with the largest data page: Parquet cannot read less than a page, and a writer
may put many large values in one page. A dictionary-encoded column (a pandas categorical) is read as
the values it holds, decoded a slice of each record batch at a time (``_decoded``).

An OS read error (it carries an ``errno``: EIO, ESTALE, ...) is retried a bounded number of times,
resuming at the row it failed on, and counted; one that outlives its retries is an I/O error (74).
A decoding error (no ``errno``: bad magic, thrift, page data) is corruption (65) at once. Permission
denied (EACCES, EPERM) on a local shard or a source directory is neither: a retry fails the same way,
and the file is no input this process can read (66, as an input file a flag names), said at once.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import glob
import hashlib
import os
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.exact_columns import field_leaves, iter_columns
from petal.pipeline.ingest.int96 import arrow_schema, open_parquet
from petal.pipeline.ingest.local_glob import expand_glob
from petal.pipeline.ingest.partitions import partition_hint
from petal.pipeline.ingest.remote import (
    RemotePath,
    file_url_path,
    is_denied,
    is_storage_error,
    is_uri,
    list_remote,
    local_path,
    object_change,
    object_sha256,
    parquet_name,
    remote_footer,
    stat_remote,
    storage_error,
)
from petal.pipeline.ingest.skipped_names import hidden_below, hidden_hint, not_parquet_hint
from petal.pipeline.ingest.text_rule import utf8_or_bytes
from petal.pipeline.reliability.errors import (
    BadInputError,
    NoInputError,
    PetalError,
    PetalIOError,
    TemporaryFailure,
    one_line,
    quote_names,
    quote_path,
)
from petal.pipeline.reliability.faults import fault
from petal.pipeline.reliability.parquet_rows import MissingRows

T = TypeVar("T")

TEXT_TYPES = "string, large_string, string_view (or binary holding UTF-8)"


def resolve_sources(sources: tuple[str, ...] | list[str], out: Path | None = None, empty_ok: bool = False,
                    held: frozenset[str] = frozenset()) -> list[Path | RemotePath]:
    """Files, directories (every ``*.parquet`` below, sorted), globs and object-storage URIs (an object or
    a prefix: pipeline/ingest/remote.py) -> sorted unique shard paths.

    A directory a glob matches is read as a directory SOURCE is (``data/*.parquet`` matching Spark's
    ``data/t.parquet/``). Directories are walked following symlinked subdirectories (each real directory once: a loop is
    walked once, not forever). The output directory ``out`` and every other petal output directory
    (``CURRENT`` + ``versions/``, or ``store/shards/``) are left out of directory and glob discovery;
    a file named explicitly inside ``out`` is refused (65). A ``*.parquet`` that is not a regular file
    (a dangling symlink, a FIFO, a device) or whose name is not UTF-8 is refused (65), never skipped.
    A source, directory or shard this process may not read (permission denied) is no input (66).
    ``empty_ok``: a local directory or glob that holds no shard names none (``petal index --sync`` over a live
    version: the removal guard judges it), where it is otherwise no input (66); the list may then be empty. An
    object-store prefix likewise (``list_remote``: one that no longer exists names none when ``held``, the live
    version's shard URIs, has a shard under it).
    """
    found: dict[str, Path | RemotePath] = {}
    problems: list[str] = []
    unreadable: list[str] = []
    for source in sources:
        if is_uri(source):
            for remote in list_remote(source, empty_ok, held):
                found.setdefault(remote.uri, remote)
            continue
        source = file_url_path(source)  # NOTE: file:///data/x is the local /data/x (it was 'URL schemes are not
        path = local_path(Path(source).expanduser())  # supported')
        try:
            path.is_dir()  # NOTE: raises only what is not "not there" (ENOENT, ENOTDIR): a parent denied
        except OSError as exc:
            if not is_permission_denied(exc):
                raise
            unreadable.append(cannot_read(path, exc))
            continue
        if path.is_dir():
            # NOTE: a directory inside petal's output (another index's store/shards or versions/v*) yields none of
            # its files, as a glob over it does; _walk sees only the output directories below its root
            matches = [] if _in_output_dir(path, None) else _walk(path, out, problems, unreadable)
            if not matches and not problems and not unreadable and not empty_ok:
                raise NoInputError(f"no *.parquet files under directory {quote_path(source)}"
                                   + (_own_output(path, out) or _hidden_only(path)))
        elif path.is_file():
            if out is not None and _inside(path, out):
                problems.append(f"{quote_path(source)} is inside the output directory {quote_path(out)}; petal does "
                                "not read its own output as input")
                continue
            matches = [path]
        elif glob.has_magic(source):
            matches = []
            skipped: Path | None = None
            unreadable_before = len(unreadable)

            def cannot_list(directory: Path, exc: OSError) -> None:
                # NOTE: glob.glob skipped such a directory without a word: under --sync its shards were removed
                which = "its directory" if directory == glob_directory(source) else "a directory it lists,"  # noqa: B023
                if is_permission_denied(exc):
                    unreadable.append(f"glob {quote_path(source)}: {which} {cannot_read(directory, exc)}")  # noqa: B023
                else:
                    problems.append(f"glob {quote_path(source)}: {which} {quote_path(directory)} cannot be "  # noqa: B023
                                    f"listed ({exc.strerror or exc})")

            for p in expand_glob(source, cannot_list):
                match = Path(p)
                if _in_output_dir(match, out):
                    skipped = skipped or match
                    continue
                if match.is_file():
                    matches.append(match)
                elif match.is_dir():
                    # NOTE: Spark and pandas write a table as a directory named like a file (``t.parquet/part-*``):
                    # a glob matching it names what a directory SOURCE names, never nothing (its rows were dropped)
                    matches.extend(_walk(match, out, problems, unreadable))
                else:
                    problems.append(_not_regular(match))
            if not matches and not problems and len(unreadable) == unreadable_before:
                # NOTE: a glob whose directory is not there matched nothing, and --sync took that for an emptied
                # corpus (every shard it named was removed at exit 0); a missing SOURCE is 66 in every run
                denied = check_glob_directory(source)
                if denied is not None:
                    unreadable.append(denied)
                    continue
            if not matches and not problems and len(unreadable) == unreadable_before and not empty_ok:
                raise NoInputError(f"glob {quote_path(source)} matches no files"
                                   + (_own_output(skipped, out) if skipped is not None else _hidden_matches(source)))
        elif path.exists() or path.is_symlink():
            problems.append(_not_regular(path))
            continue
        else:
            if "://" in source:
                raise NoInputError(f"source {quote_path(source)}: URL schemes are not supported; give local paths")
            raise NoInputError(f"source {quote_path(source)} does not exist")
        for match in matches:
            if not _utf8_name(match):
                problems.append(f"{quote_path(match)}: the file name is not valid UTF-8; rename it")
                continue
            found.setdefault(str(match.resolve()), match)
    raise_problems(unreadable, problems)
    if not found and not empty_ok:
        raise NoInputError("no input shards")
    return [found[key] for key in sorted(found)]


def glob_directory(source: str) -> Path:
    """The directory glob ``source`` lists: its path before the first component holding a wildcard (``.`` when that
    is the first)."""
    parts = Path(os.path.expanduser(source)).parts
    fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    return Path(*parts[:fixed]) if fixed else Path(".")


def check_glob_directory(source: str) -> str | None:
    """Whether the directory glob ``source`` lists is there: ``NoInputError`` (66) naming the glob and the directory
    when it is not (or is no directory); the problem (66, said with the sources' others) when this process may not
    list it; ``None`` when it lists (a glob that matches nothing there names an emptied corpus)."""
    directory = glob_directory(source)
    try:
        with os.scandir(directory):
            return None
    except (FileNotFoundError, NotADirectoryError) as exc:
        what = "does not exist" if isinstance(exc, FileNotFoundError) else "is not a directory"
        raise NoInputError(f"glob {quote_path(source)} matches no files: its directory {quote_path(directory)} "
                           f"{what}") from None
    except OSError as exc:
        if not is_permission_denied(exc):
            raise
        return f"glob {quote_path(source)}: its directory {cannot_read(directory, exc)}"


def is_permission_denied(exc: BaseException) -> bool:
    """A local file or directory this process may not read (EACCES, EPERM): not transient, not corrupt."""
    return isinstance(exc, OSError) and not is_storage_error(exc) and exc.errno in (errno.EACCES, errno.EPERM)


def cannot_read(path: Path | RemotePath, exc: OSError) -> str:
    reason = os.strerror(exc.errno) if exc.errno is not None else str(exc)
    return f"{quote_path(path)}: cannot be read ({reason})"


def raise_problems(unreadable: list[str], problems: list[str]) -> None:
    """The sources' problems, all in one line: inputs this process may not read first (66), then bad ones (65)."""
    for found, error in ((unreadable, NoInputError), (problems, BadInputError)):
        if found:
            more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
            raise error("; ".join(found[:5]) + more)


def _utf8_name(path: Path) -> bool:
    try:
        str(path).encode("utf-8")
        return True
    except UnicodeEncodeError:  # NOTE: os.fsdecode keeps undecodable bytes as lone surrogates
        return False


def _not_regular(path: Path) -> str:
    if path.is_symlink() and not path.exists():
        return f"{quote_path(path)} is a dangling symlink"
    return f"{quote_path(path)} is not a regular file (a FIFO, a device or a socket?)"


def _inside(path: Path, root: Path) -> bool:
    real, real_root = os.path.realpath(path), os.path.realpath(root)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def _own_output(path: Path, out: Path | None) -> str:
    """Why a directory or glob match that holds Parquet files names none: it lies in an output directory."""
    if out is not None and _inside(path, out):
        return (f" outside the output directory {quote_path(out)} (it is, or holds, the source); petal does not read "
                "its own output as input")
    from petal.pipeline.layout import is_output_dir

    if is_output_dir(path) or _in_output_dir(path, None):
        return (" outside petal output directories (the source is or lies in one); petal does not read its output "
                "as input")
    return ""


def _in_output_dir(path: Path, out: Path | None) -> bool:
    """True when ``path`` lies in ``out`` or in any petal output directory above it."""
    if out is not None and _inside(path, out):
        return True
    from petal.pipeline.layout import is_output_dir

    return any(is_output_dir(parent) for parent in Path(os.path.abspath(path)).parents)


def _hidden_matches(source: str) -> str:
    """Why a glob SOURCE that matches no file names no shard, for its error: ``""``, or the *.parquet files it would
    name but for hidden parts (``hidden_hint``: ``data/**/*.parquet`` over only ``data/_temporary/``). The error path
    only: one more expansion."""
    hidden: set[str] = set()
    root = glob_directory(source)
    for match in map(Path, expand_glob(source, lambda directory, exc: None, skip_hidden=False)):
        if match.is_dir():
            hidden.update(map(str, _skipped_below(match, hidden_root=hidden_below(_parts_below(match, root)))[0]))
        elif parquet_name(match.name) and match.is_file():
            hidden.add(str(match))
    return hidden_hint(sorted(hidden), "glob")


def _hidden_only(root: Path) -> str:
    """Why a directory SOURCE that holds files names no shard, for its error: ``""``, or what it skips: *.parquet
    files under paths starting with '.' or '_' (``hidden_hint``), else files not named *.parquet
    (``not_parquet_hint``). NOTE: 'no *.parquet files' alone sent a user looking for files that are there (a Spark
    job still writing has only ``_temporary/``; ``part-0.parq``). The error path only: one more walk."""
    skipped, others = _skipped_below(root)
    return hidden_hint(list(map(str, skipped)), "directory SOURCE") or not_parquet_hint(others, "directory")


def _parts_below(path: Path, root: Path) -> tuple[str, ...]:
    try:
        return path.relative_to(root).parts
    except ValueError:
        return ()


def _skipped_below(root: Path, hidden_root: bool = False) -> tuple[list[Path], list[str]]:
    """The *.parquet files below ``root`` under hidden paths (every one, with ``hidden_root``: ``root`` is itself
    hidden where a glob matched it), and the files there not named *.parquet, each sorted."""
    skipped: list[Path] = []
    others: list[str] = []
    seen: set[tuple[int, int]] = set()
    for directory, subdirs, files in os.walk(root, followlinks=True):
        st = os.stat(directory)
        if (st.st_dev, st.st_ino) in seen:
            subdirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        below = Path(directory).relative_to(root).parts
        for name in sorted(files):
            if hidden_root or hidden_below((*below, name)):
                if parquet_name(name):
                    skipped.append(Path(directory) / name)
            elif not parquet_name(name) and os.path.isfile(os.path.join(directory, name)):
                others.append(os.path.join(directory, name))
        subdirs.sort()
    return skipped, others


def _walk(root: Path, out: Path | None, problems: list[str], unreadable: list[str]) -> list[Path]:
    """Every ``*.parquet`` below ``root`` (symlinked directories followed once each; output dirs skipped)."""
    from petal.pipeline.layout import is_output_dir

    def cannot_list(exc: OSError) -> None:
        if is_permission_denied(exc):
            unreadable.append(cannot_read(Path(exc.filename), exc))
        else:
            problems.append(f"cannot list {quote_path(exc.filename)}: {exc.strerror or exc}")

    seen: set[tuple[int, int]] = set()
    found: list[Path] = []
    for directory, subdirs, files in os.walk(root, followlinks=True, onerror=cannot_list):
        st = os.stat(directory)
        if (st.st_dev, st.st_ino) in seen:  # a symlink loop, or a directory reached twice
            subdirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        here = Path(directory)
        if (out is not None and _inside(here, out)) or is_output_dir(here):
            subdirs[:] = []  # petal's own output (store entries, versions, rejects) is never input
            continue
        subdirs[:] = sorted(d for d in subdirs if not hidden_below((d,)))  # _temporary/, _delta_log/, .git/
        for name in sorted(files):
            if not parquet_name(name) or hidden_below((name,)):
                continue
            path = here / name
            try:
                regular = path.is_file()
            except OSError as exc:  # a directory that lists but cannot be entered (mode r--)
                if not is_permission_denied(exc):
                    raise
                unreadable.append(cannot_read(path, exc))
                continue
            if regular:
                found.append(path)
            else:
                problems.append(_not_regular(path))
    return found


@dataclass(frozen=True)
class ShardInfo:
    """One input shard as its footer describes it (read before any model work)."""

    path: Path | RemotePath  # as the user named it (display, ids); an object's safe URI for remote shards
    abs_path: str  # the shard's identity: its resolved path, or its URI
    size: int
    mtime_ns: int
    num_rows: int
    num_row_groups: int
    has_id_column: bool
    id_type: str  # Arrow type of the id column's values, a dictionary's value type ("" when absent)
    text_type: str  # Arrow type of the text column's values (as id_type)
    # NOTE: change detection never trusts (size, mtime) alone: ``cp -p``, ``rsync -t`` and tar set the
    # mtime back, but not the inode change time; the footer's hash changes with the data's layout.
    ctime_ns: int = 0
    inode: int = 0
    footer_sha256: str = ""
    # an object's content identity (``remote_sha256``), from the footer preflight read; "" for a local file
    object_sha256: str = field(default="", compare=False)
    # the Arrow schema preflight read from the footer: later checks (``--keep-columns``) use it, never a second read
    schema: pa.Schema | None = field(default=None, compare=False, repr=False)
    # the rows of each row group, from the same footer (row-group ranges: pipeline/store/ranges.py)
    group_rows: tuple[int, ...] = field(default=(), compare=False, repr=False)
    # a kept hdfs:///... shard an older petal recorded, of a namenode unknown (``ShardRecord.default_namenode``)
    namenode_unknown: bool = False
    # a kept s3://b/k or gs://b/k shard an older petal recorded, its endpoint unknown (``ShardRecord.default_endpoint``)
    endpoint_unknown: bool = False


def plain_type(t: pa.DataType) -> pa.DataType:
    """The type a column's values have: a dictionary-encoded column (a pandas categorical,
    ``dictionary_encode()``) holds its value type; the readers decode it (``_decoded``)."""
    return t.value_type if pa.types.is_dictionary(t) else t


def _is_text(t: pa.DataType) -> bool:
    """A text column's type; ``null`` too: pandas writes a column whose values are all None (a shard or partition with
    no text at all) as Arrow ``null``, whose rows are null texts (``null_text``), as in a string column."""
    t = plain_type(t)
    return (pa.types.is_null(t) or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or str(t) in ("string_view", "binary_view"))


def _is_id(t: pa.DataType) -> bool:
    """An id column's type; ``null`` too: pandas writes a column whose values are all None as Arrow ``null``, whose
    rows are null ids (``null_id``), as in an integer or string column (``no_ids``)."""
    t = plain_type(t)
    return (pa.types.is_null(t) or pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or str(t) == "string_view")


def no_ids(id_type: str) -> bool:
    """``ShardInfo.id_type`` of an id column of Arrow type ``null``: every row is a null id, so the shard gives the
    index no id and no kind of id (integer or string).

    NOTE: counted as a string column, one such shard turned an index of integer ids into one of strings."""
    return id_type == "null"


def string_ids(id_type: str) -> bool:
    """The shard gives the index string ids: a string id column, or none (``<shard>:<row>``); not ``no_ids``."""
    return not integer_ids(id_type) and not no_ids(id_type)


def integer_ids(id_type: str) -> bool:
    """``ShardInfo.id_type`` (the id values' Arrow type, a dictionary's value type) names an integer type.

    NOTE: never ``"int" in id_type``: ``dictionary<values=string, indices=int32>`` holds string ids."""
    return id_type.startswith(("int", "uint"))


@dataclass
class ReadStats:
    """What the reader recovered from: ``retries``, the retries of OS read errors whose read then succeeded (a read
    that fails after its retries adds none); and what a run's checks found
    of the files they read (``values_fit``: a kept column's values checked against the type it is stored as,
    ``pipeline/store/kept_values.py``), so that a second check (under the lock) does not read them again."""

    retries: int = 0
    values_fit: set[tuple[str, ...]] = field(default_factory=set)


def _transient(exc: BaseException) -> bool:
    # NOTE: pyarrow raises OSError for corrupt pages too, but without an errno; only the operating
    # system's errors (EIO, ESTALE, ETIMEDOUT, ENOENT of a vanished file, ...) carry one, and object
    # storage's client errors (no errno, "AWS Error ..."), of which all but a refusal are retried.
    if is_storage_error(exc):
        return not is_denied(exc)
    return isinstance(exc, OSError) and exc.errno is not None and not is_permission_denied(exc)


def _read_error(path: Path | RemotePath, exc: BaseException, retries: int, corrupt: str) -> PetalError:
    if is_denied(exc):
        return storage_error(f"cannot read {path}", exc)
    if is_permission_denied(exc):  # a retry fails the same way: no input, at once
        return NoInputError(cannot_read(path, cast(OSError, exc)))
    if isinstance(exc, OSError) and exc.errno == errno.ENOENT and _gone(path):
        # NOTE: still gone after the retries: removed or renamed since preflight listed it (a producer's job), which
        # a rerun settles (75, as a shard that changed: ``check_unchanged``), not a failing disk or storage (74)
        return ShardChangedError(f"{quote_path(path)} was removed or renamed while petal was indexing it: nothing "
                                 "of it is indexed; rerun (finished shards are kept)")
    if _transient(exc):
        return PetalIOError(f"{quote_path(path)}: read error after {retries} retries ({exc}); "
                            "the file is unreadable now, not corrupt: rerun when the storage recovers")
    return BadInputError(f"{quote_path(path)}: {corrupt} ({one_line(str(exc))})")


def _gone(path: Path | RemotePath) -> bool:
    """Whether the shard ``path`` is not there now (``False`` where the storage does not answer)."""
    if isinstance(path, RemotePath):
        try:
            stat_remote(path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return False
    return not path.exists()


def _backoff(read: ReadConfig, retry: int) -> None:
    time.sleep(read.retry_delay_s * 2 ** (retry - 1))


def _recovered(stats: ReadStats | None, retries: int) -> None:
    """Count the ``retries`` of a read that then succeeded.

    NOTE: every retry was counted as it was made, so a run whose read failed after all its retries (74) said
    'recovered: 3 read' in its summary and ``retries.read`` 3 in its report."""
    if stats is not None:
        stats.retries += retries


def _retrying(call: Callable[[], T], read: ReadConfig, stats: ReadStats | None) -> T:
    retry = 0
    while True:
        try:
            result = call()
        except OSError as exc:
            if not _transient(exc) or retry >= read.read_retries:
                raise
            retry += 1
            _backoff(read, retry)
            continue
        _recovered(stats, retry)
        return result


def read_retrying(path: Path | RemotePath, call: Callable[[], T], read: ReadConfig, stats: ReadStats | None,
                  corrupt: str) -> T:
    """``call()``, a read of the source ``path`` outside the rows phase (its whole content hashed, a schema),
    judged as the readers judge theirs: an OS read error retried (backing off, counted in ``stats``) then 74,
    permission denied 66 at once, a decoding error 65 (``corrupt``), each naming ``path``."""
    try:
        return _retrying(call, read, stats)
    except (OSError, pa.ArrowException) as exc:
        raise _read_error(path, exc, read.read_retries, corrupt) from exc


def _footer(path: Path | RemotePath) -> tuple[Any, pq.FileMetaData, str]:
    """The shard's stat, footer and identity: a local file's ``footer_sha256``, an object's ``remote_sha256``.

    NOTE: an object's identity is hashed from the very bytes its metadata is parsed from: it was read again for
    the hash (a HEAD and two ranged GETs more per object, every run, a rerun with nothing changed too)."""
    fault("read_footer", str(path))
    if isinstance(path, RemotePath):
        stat = stat_remote(path)
        with path.open() as fh:  # the footer only: ranged reads at the object's end
            footer = remote_footer(fh, stat.st_size)
            meta = _parsed_footer(footer)
            if meta is None:  # not a Parquet footer: the reader's own error, naming what it found
                meta = pq.read_metadata(fh)
        return stat, meta, object_sha256(stat.st_size, stat.st_mtime_ns, footer)
    return path.stat(), pq.read_metadata(path), footer_sha256(path)


def _parsed_footer(footer: bytes) -> pq.FileMetaData | None:
    """The metadata of a Parquet footer (``remote_footer``); ``None`` when it is not one that parses."""
    if len(footer) < 12 or not footer.endswith(b"PAR1"):
        return None
    try:
        return pq.read_metadata(pa.BufferReader(b"PAR1" + footer))  # the leading magic a file starts with
    except (OSError, pa.ArrowException):
        return None


def footer_sha256(path: Path) -> str:
    """sha256 of the Parquet footer (its metadata, length and magic): cheap, and it changes with the layout."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size < 12:
            return ""
        fh.seek(size - 8)
        length = int.from_bytes(fh.read(4), "little")
        start = max(0, size - 8 - length)
        fh.seek(start)
        return hashlib.sha256(fh.read(size - start)).hexdigest()


def check_unique_columns(path: Path | RemotePath, schema: pa.Schema, names: list[str]) -> None:
    """Each of ``names`` (the columns a run reads) is at most one column of ``schema``: Parquet allows two columns of
    one name, and then no reader can tell which is meant (65 naming the file and the column)."""
    for name in dict.fromkeys(names):
        count = len(schema.get_all_field_indices(name))
        if count > 1:
            raise BadInputError(f"{quote_path(path)}: {count} columns are named {name!r}; petal reads columns by name "
                                "and cannot tell which one is meant: rename or drop the others")


def inspect_shard(path: Path | RemotePath, read: ReadConfig, stats: ReadStats | None = None) -> ShardInfo:
    """Read one footer and check the schema. Raises ``BadInputError`` naming file, column and type."""
    try:
        stat, meta, identity = _retrying(lambda: _footer(path), read, stats)
        schema = arrow_schema(meta)  # INT96 as the reader reads it (int96.py)
    except (OSError, pa.ArrowException) as exc:
        raise _read_error(path, exc, read.read_retries, "not a readable Parquet file") from exc
    names = schema.names
    check_unique_columns(path, schema, [read.text_column, read.id_column])
    if read.text_column not in names:
        raise BadInputError(
            f"{quote_path(path)}: text column {read.text_column!r} is missing (columns: {quote_names(names)}); "
            "choose one with --text-column" + partition_hint(path, [read.text_column])
        )
    text_type = plain_type(schema.field(read.text_column).type)  # a dictionary's values: decoded as they are read
    if not _is_text(text_type):
        raise BadInputError(f"{quote_path(path)}: text column {read.text_column!r} has type {text_type}, "
                            f"expected {TEXT_TYPES}")
    has_id = read.id_column in names
    if not has_id and read.id_column_required:
        raise BadInputError(
            f"{quote_path(path)}: id column {read.id_column!r} is missing (columns: {quote_names(names)}); "
            "choose one with --id-column" + partition_hint(path, [read.id_column])
        )
    id_type = plain_type(schema.field(read.id_column).type) if has_id else None
    if id_type is not None and not _is_id(id_type):
        raise BadInputError(f"{quote_path(path)}: id column {read.id_column!r} has type {id_type}, "
                            "expected an integer or string")
    info = ShardInfo(
        path=path,
        abs_path=path.uri if isinstance(path, RemotePath) else str(path.resolve()),
        size=stat.st_size,
        mtime_ns=stat.st_mtime_ns,
        num_rows=meta.num_rows,
        num_row_groups=meta.num_row_groups,
        has_id_column=has_id,
        id_type=str(id_type) if id_type is not None else "",
        text_type=str(text_type),
        ctime_ns=getattr(stat, "st_ctime_ns", 0),  # 0 for an object: its hash is taken every run
        inode=getattr(stat, "st_ino", 0),
        footer_sha256="" if isinstance(path, RemotePath) else identity,
        object_sha256=identity if isinstance(path, RemotePath) else "",
        schema=schema,
        group_rows=tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups)),
    )
    check_id_range(info, meta, read, stats)
    return info


INT64_MAX = 2**63 - 1


def check_id_range(info: ShardInfo, meta: pq.FileMetaData, read: ReadConfig, stats: ReadStats | None,
                   id_column: str | None = None) -> None:
    """uint64 ids must fit the store's int64 ids (text and ``--vectors-column`` shards alike, and ``petal embed
    --input``'s ids, as ``petal index`` takes them): the footer's statistics when complete, else the column, streamed
    by the rows' reader (an OS read error retried then 74, permission denied 66, a corrupt page 65 naming the row
    group and column). Other id types pass at once. ``id_column``: the id column's name (default
    ``read.id_column``)."""
    import pyarrow.compute as pc

    if info.id_type != "uint64":
        return
    id_column = read.id_column if id_column is None else id_column

    # NOTE: by the field's position: a struct's leaf may have the id column's name (``meta.id`` beside ``meta{id}``)
    leaves = field_leaves(meta, [id_column])
    column = leaves[0][0] if leaves is not None and len(leaves[0]) == 1 else -1
    highest = 0
    for g in range(meta.num_row_groups):
        group_stats = meta.row_group(g).column(column).statistics if column >= 0 else None
        if group_stats is None or not group_stats.has_min_max:
            break
        highest = max(highest, int(group_stats.max))
    else:
        if highest <= INT64_MAX:
            return

    def first_over(row: int, batch: pa.RecordBatch) -> tuple[int, int] | None:
        values = batch.column(0)
        at = pc.index(pc.greater(values, pa.scalar(INT64_MAX, pa.uint64())), True).as_py()
        return None if at < 0 else (row + at, values[at].as_py())

    with contextlib.closing(stream_batches(info, [id_column], read, first_over, stats)) as found:
        over = next((hit for hit in found if hit is not None), None)
    if over is not None:
        raise BadInputError(f"{quote_path(info.path)}: id column {id_column!r} (uint64) holds {over[1]} at "
                            f"row {over[0]}, above the largest id petal stores ({INT64_MAX}, int64); store the ids "
                            "as int64 or as strings")


def preflight(paths: list[Path | RemotePath], read: ReadConfig, stats: ReadStats | None = None,
              check: Callable[[], None] | None = None) -> list[ShardInfo]:
    """Every shard's footer and schema, checked before any model work; all problems in one error. ``check`` runs
    before each footer (``StopSignals.check``: a stop signal ends a preflight of many shards at once)."""
    infos: list[ShardInfo] = []
    problems: list[str] = []
    unreadable: list[str] = []
    for path in paths:
        if check is not None:
            check()
        try:
            infos.append(inspect_shard(path, read, stats))
        except BadInputError as exc:
            problems.append(str(exc))
        except NoInputError as exc:  # permission denied (an object that is gone: 66 too)
            unreadable.append(str(exc))
    raise_problems(unreadable, problems)
    check_id_kinds(infos, read.id_column)
    return infos


def _id_kind(info: ShardInfo) -> str | None:
    """``"int"`` or ``"str"``: the kind of the ids a shard gives the index (a shard preflight read without an id
    column: ``<shard>:<row>`` strings); ``None`` when unknown (a kept shard whose store entry predates ``id_type``) or
    none (``no_ids``)."""
    if no_ids(info.id_type):
        return None
    if info.id_type:
        return "int" if integer_ids(info.id_type) else "str"
    return "str" if info.schema is not None and not info.has_id_column else None


def check_id_kinds(infos: list[ShardInfo], id_column: str) -> None:
    """One kind of id in every shard of an index: the shards a run names and (under the lock) the live version's
    shards it keeps (no schema: ``kept``), for text and ``--vectors-column`` runs alike. A mix is 65 naming them.

    NOTE: the index stores one id type: integer ids beside string ones were stored as strings (``7`` became
    ``"7"``, and the same as a string id ``"7"`` of another shard), silently, from one run to the next."""
    kinds = {kind for s in infos if (kind := _id_kind(s)) is not None}
    if len(kinds) <= 1:
        return

    def said(info: ShardInfo) -> str:
        what = info.id_type or "no id column: ids are '<shard>:<row>' strings"
        return f"{quote_path(info.path)} ({what}{'' if info.schema is not None else ', kept from the live version'})"

    kept = any(s.schema is None for s in infos if _id_kind(s) is not None)
    raise BadInputError(f"id column {id_column!r} is an integer in some shards and a string in others: "
                        + ", ".join(said(s) for s in infos if _id_kind(s) is not None)
                        + ("; to change the kind of ids of the whole index, name every shard with --sync" if kept
                           else ""))


@dataclass(frozen=True)
class RowBatch:
    """Consecutive rows of one shard: ``rows[i]`` is the row number of ``texts[i]``."""

    shard_index: int
    row_start: int
    ids: list  # document ids (int or str); synthesized "<shard>:<row>" when the shard has no id column
    texts: list  # str, bytes or None


def batch_rows(pf: pq.ParquetFile, columns: list[str], read: ReadConfig) -> int:
    """Rows per record batch: ``read.batch_rows``, fewer when the footer says rows are large.

    ``columns``: every column the batches hold (a row's bytes are the sum of theirs: a ``--keep-columns`` column of
    large values beside a short text counts).

    NOTE: sized from each row group's average bytes per row; one huge row among small ones
    can still make a batch larger than ``read.max_batch_bytes`` (never larger than its row group).
    """
    return rows_within(pf.metadata, columns, read.batch_rows, read.max_batch_bytes)


def rows_within(meta: pq.FileMetaData, columns: list[str], most_rows: int, max_bytes: int) -> int:
    """At most ``most_rows``, fewer where the footer's uncompressed bytes per row of ``columns`` (summed, the largest
    of any row group) would put more than ``max_bytes`` in one record batch; at least 1."""
    leaves = field_leaves(meta, list(dict.fromkeys(columns)))
    if leaves is None:  # a nested column's chunks are named 'name.list.element' and the like
        paths = [meta.schema.column(i).path for i in range(meta.num_columns)]
        chunks = [i for i, path in enumerate(paths) if any(path == n or path.startswith(f"{n}.") for n in columns)]
    else:  # NOTE: by position: a dotted name ('body.en') is also the path of a struct's child
        chunks = sorted({i for field in leaves for i in field})
    per_row = 1
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        if not group.num_rows:
            continue
        size = sum(group.column(i).total_uncompressed_size for i in chunks)
        per_row = max(per_row, size // group.num_rows)
    return max(1, min(most_rows, max_bytes // per_row))


def _record_batches(info: ShardInfo, columns: list[str], read: ReadConfig, start_row: int,
                    stop_row: int | None = None) -> Iterator[pa.RecordBatch]:
    """The shard's record batches from row ``start_row`` on (a retry resumes where it failed), up to the row
    group that holds row ``stop_row`` (``None``: the end; a row-group range ends on a row-group boundary)."""
    # NOTE: a local shard is read through one descriptor, checked against preflight's stat when opened and after
    # every record batch (``check_unchanged``): a shard replaced or rewritten since preflight (whose footer, rows and
    # content hash the run recorded) is never embedded or stored as if it were the file preflight saw.
    # An object is checked (a request for its size and Last-Modified) before it is opened and after its last batch:
    # any write in between gives it a new Last-Modified, so no row of an object replaced mid-read is committed.
    remote = info.path if isinstance(info.path, RemotePath) else None
    if remote is not None:
        check_object_unchanged(info, remote)
    source = info.path.open() if isinstance(info.path, RemotePath) else pa.OSFile(os.fspath(info.path))
    fd = None if remote is not None else source.fileno()
    if fd is not None:
        check_unchanged(info, os.fstat(fd))
    # NOTE: page CRCs are verified where a writer stored them (a corrupt page is 65, never embedded)
    with contextlib.closing(cast(Any, source)), \
            open_parquet(source, buffer_size=read.read_buffer_bytes, pre_buffer=False,
                         page_checksum_verification=True) as pf:
        try:
            meta = pf.metadata
            starts = [0]
            for g in range(meta.num_row_groups):
                starts.append(starts[-1] + meta.row_group(g).num_rows)
            first = bisect.bisect_right(starts, start_row) - 1
            if first >= meta.num_row_groups:
                return
            skip = start_row - starts[first]
            size = batch_rows(pf, columns, read)
            stop = meta.num_row_groups if stop_row is None else bisect.bisect_left(starts, stop_row)
            got = 0
            for batch in iter_columns(pf, columns, size, range(first, stop)):
                if fd is not None:
                    check_unchanged(info, os.fstat(fd))  # the batch's pages are read: they are preflight's file's
                got += batch.num_rows
                if skip >= batch.num_rows:
                    skip -= batch.num_rows
                    continue
                yield from _decoded(batch.slice(skip) if skip else batch, read.max_batch_bytes)
                skip = 0
            if got != starts[stop] - starts[first]:  # NOTE: a page pyarrow skipped (parquet_rows): rows shifted
                raise _short_group(pf, columns, range(first, stop), starts, got)
            if remote is not None:
                check_object_unchanged(info, remote)
        except (OSError, pa.ArrowException):
            if fd is not None:  # a file cut or rewritten under the reader fails to decode: it changed, not corrupt
                check_unchanged(info, os.fstat(fd))
            elif remote is not None:
                with contextlib.suppress(OSError):  # the storage does not answer: the read's own error stands
                    check_object_unchanged(info, remote)
            raise


class ShardChangedError(TemporaryFailure):
    """A source shard changed (rewritten in place, replaced, cut) after preflight read its footer and stat: what
    the run read of it is not what it recorded. Nothing of it is committed; a rerun reads its new content (75)."""


def check_object_unchanged(info: ShardInfo, remote: RemotePath) -> None:
    """Raise ``ShardChangedError`` when the object ``remote`` (``info.path``) is not the one ``info`` describes:
    removed, or another size or Last-Modified. Raises ``OSError`` when the storage does not answer."""
    change = object_change(remote, info.size, info.mtime_ns)
    if change is not None:
        raise ShardChangedError(f"{remote} {change} while petal was indexing it: nothing of it is indexed; rerun "
                                "once it is written (finished shards are kept)")


def check_unchanged(info: ShardInfo, stat: os.stat_result) -> None:
    """Raise ``ShardChangedError`` when ``stat`` (of the open shard) is not the file ``info`` describes: size and
    mtime, and the inode and its change time where ``info`` has them (a ``touch -d``/``cp -p`` puts the mtime back,
    never the change time)."""
    seen = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "inode": stat.st_ino, "ctime_ns": stat.st_ctime_ns}
    known = {"size": info.size, "mtime_ns": info.mtime_ns, "inode": info.inode, "ctime_ns": info.ctime_ns}
    differ = [key for key, value in known.items() if (value or key in ("size", "mtime_ns")) and seen[key] != value]
    if differ:
        raise ShardChangedError(f"{quote_path(info.path)} changed while petal was indexing it ({', '.join(differ)} "
                                "differ from when the run began): nothing of it is indexed; rerun once it is "
                                "written (finished shards are kept)")


def _decoded(batch: pa.RecordBatch, max_bytes: int) -> Iterator[pa.RecordBatch]:
    """``batch`` with its dictionary-encoded columns (a pandas categorical, ``dictionary_encode()``) decoded to
    their values, in slices of at most ``max_bytes`` of decoded values (at least one row each).

    NOTE: ``batch_rows`` sized the batch from the footer's bytes, which for a dictionary column count its
    indices, not the values each row repeats: 4096 rows of one 1 MB category would decode to 4 GB at once."""
    encoded = [i for i, column in enumerate(batch.columns) if pa.types.is_dictionary(column.type)]
    if not encoded:
        yield batch
        return
    import numpy as np
    import pyarrow.compute as pc

    per_row = np.zeros(batch.num_rows, dtype=np.int64)
    for i in encoded:
        column = cast(pa.DictionaryArray, batch.column(i))
        values = column.dictionary
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type) \
                or pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
            sizes = pc.fill_null(pc.binary_length(values), 0).cast(pa.int64())
        else:  # fixed-width or nested values: their average size
            sizes = pa.array([values.nbytes // max(1, len(values))] * len(values), pa.int64())
        per_row += pc.fill_null(pc.take(sizes, column.indices), 0).to_numpy(zero_copy_only=False)
    ends = np.cumsum(per_row)
    start = 0
    while start < batch.num_rows:
        before = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, before + max_bytes, side="right")))
        part = batch.slice(start, stop - start)
        columns = [cast(pa.DictionaryArray, c).dictionary_decode() if i in encoded else c
                   for i, c in enumerate(part.columns)]
        yield pa.RecordBatch.from_arrays(columns, names=part.schema.names)
        start = stop


def _as_binary(column: pa.Array) -> pa.Array:
    """A string column's values as the bytes they are (no copy)."""
    binary = {pa.large_string(): pa.large_binary(), pa.string_view(): pa.binary_view()}.get(column.type, pa.binary())
    return column.view(binary)


def _texts(column: pa.Array) -> list:
    """The text column as Python values; bytes for every row of a batch holding invalid UTF-8."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        # NOTE: pyarrow does not validate UTF-8 when it reads a string column; the rows are checked
        # (and the bad ones rejected) one by one in pipeline/ingest/documents.py.
        return _as_binary(column).to_pylist()


def read_ids(column: pa.Array) -> list:
    """The id column (integers or strings) as Python values; an id whose bytes are not UTF-8 (a lone surrogate's
    encoding included) as those bytes, every other id as its ``str``: the readers reject such a row
    (``invalid_utf8_id``: pipeline/ingest/documents.py, vectors.py) or refuse the file (``first_undecodable``).

    NOTE: pyarrow validates no UTF-8 when it reads a string column: ``to_pylist`` raises ``UnicodeDecodeError`` on
    the first bad value (a traceback, exit 1), and such an id could be neither stored as text nor deleted."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        return [None if raw is None else utf8_or_bytes(raw) for raw in _as_binary(column).to_pylist()]


def without_undecodable_ids(column: pa.Array) -> pa.Array:
    """A string id column without its ids that are not UTF-8 (``read_ids``), nulls kept; others as they are.

    NOTE: Arrow's full validation checks UTF-8 as Python decodes it (a lone surrogate's encoding is refused too);
    only a batch that fails it is filtered value by value."""
    if pa.types.is_integer(column.type):
        return column
    try:
        column.validate(full=True)
        return column
    except pa.ArrowInvalid:
        return column.filter(pa.array([not isinstance(v, bytes) for v in read_ids(column)]))


def first_undecodable(ids: list) -> int | None:
    """The position of the first id of ``read_ids`` that is not UTF-8, or ``None``."""
    return next((i for i, doc_id in enumerate(ids) if isinstance(doc_id, bytes)), None)


def read_rows(shard_index: int, info: ShardInfo, read: ReadConfig, stats: ReadStats | None = None,
              start_row: int = 0, stop_row: int | None = None) -> Iterator[RowBatch]:
    """Stream one shard's (id, text) rows in record batches (see ``batch_rows``), retrying OS read errors.

    ``start_row``/``stop_row``: a row-group range of the shard (both on row-group boundaries); rows keep
    their numbers within the shard."""
    columns = [read.text_column] + ([read.id_column] if info.has_id_column else [])

    def decode(row: int, record_batch: pa.RecordBatch) -> RowBatch:
        texts = _texts(record_batch.column(0))
        if info.has_id_column:
            ids = read_ids(record_batch.column(1))  # an id that is not UTF-8 as bytes: documents.py rejects it
        else:
            ids = [f"{info.path}:{r}" for r in range(row, row + len(texts))]
        return RowBatch(shard_index, row, ids, texts)

    return stream_batches(info, columns, read, decode, stats, start_row, stop_row)


def stream_batches(info: ShardInfo, columns: list[str], read: ReadConfig, decode: Callable[[int, pa.RecordBatch], T],
                   stats: ReadStats | None = None, start_row: int = 0, stop_row: int | None = None
                   ) -> Generator[T, None, None]:
    """``decode(first row, record batch)`` of each of the shard's record batches (``columns``, from ``start_row``),
    the one reader of shard rows after preflight (text runs and ``--vectors-column``): pages streamed, page
    checksums verified, batches sized by bytes (``_record_batches``). An OS read error is retried (backing off,
    counted in ``stats``) resuming at the row it failed on, then 74; a decoding error (corrupt page, bad
    checksum, cut column chunk: no errno) is 65 at once; permission denied 66; each naming the file, the row
    the failed batch starts at and the columns. ``decode`` runs inside the retry: it must not change state a
    retry would see twice (the caller's bookkeeping belongs after the ``yield``)."""
    row = start_row
    retry = 0
    while True:
        try:
            if stop_row is not None and row >= stop_row:
                return
            for record_batch in _record_batches(info, columns, read, row, stop_row):
                fault("read_batch", str(info.path))
                item = decode(row, record_batch)
                _recovered(stats, retry)
                row, retry = row + record_batch.num_rows, 0
                yield item
            _recovered(stats, retry)  # a retry that found no more rows succeeded too
            return
        except (OSError, pa.ArrowException) as exc:
            if not _transient(exc) or retry >= read.read_retries:
                corrupt = not (_transient(exc) or is_permission_denied(exc) or is_denied(exc))
                if isinstance(exc, ShortRowGroup):  # located where it was found
                    where, first = "", exc.first_row
                else:
                    where, first = _locate(info, columns, read, row) if corrupt else ("", row)
                raise _read_error(info.path, exc, retry, f"cannot read rows from row {first}{where}: corrupt data"
                                  ) from exc
            retry += 1
            _backoff(read, retry)


class ShortRowGroup(MissingRows):
    """A row group of a source shard whose column decodes to fewer rows than the footer counts, located."""

    def __init__(self, got: int, expected: int, group: int, column: str, first_row: int) -> None:
        super().__init__(got, expected, f"row group {group}, column {column!r}")
        self.first_row = first_row


def _short_group(pf: pq.ParquetFile, columns: list[str], groups: range, starts: list[int], got: int) -> MissingRows:
    """The error of a read of ``groups`` that gave other than the footer's row count: the first row group and
    column whose pages hold other than their count (each read alone: the error path only), else the whole count."""
    for g in groups:
        expected = pf.metadata.row_group(g).num_rows
        for column in columns:
            held = sum(batch.num_rows for batch in iter_columns(pf, [column], 65_536, [g]))
            if held != expected:
                return ShortRowGroup(held, expected, g, column, starts[g])
    return MissingRows(got, starts[groups.stop] - starts[groups.start])


def _locate(info: ShardInfo, columns: list[str], read: ReadConfig, row: int) -> tuple[str, int]:
    """Where a batch from ``row`` failed to decode: `` (row group G, column 'C')`` and the group's first row (a batch
    can span several row groups: the rows before that group read), found by reading the row groups that batch spans
    one column at a time (the error path only: at most one batch's bytes); else ``("", row)``."""
    try:
        with contextlib.closing(cast(Any, info.path.open())) if isinstance(info.path, RemotePath) else \
                contextlib.nullcontext(info.path) as source, \
                open_parquet(source, buffer_size=read.read_buffer_bytes, pre_buffer=False,
                             page_checksum_verification=True) as pf:
            meta, stop = pf.metadata, row + batch_rows(pf, columns, read)
            first, end = 0, 0
            for g in range(meta.num_row_groups):
                first, end = end, end + meta.row_group(g).num_rows
                if end <= row:
                    continue
                if first >= stop:
                    break
                for column in columns:
                    try:
                        for _ in iter_columns(pf, [column], read.batch_rows, [g]):
                            pass
                    except (OSError, pa.ArrowException):
                        return f" (row group {g}, column {column!r})", max(first, row)
    except (OSError, pa.ArrowException):
        pass
    return "", row
