"""Stored columns: each indexed document's text and the ``--keep-columns`` the user chose, kept with its id.

```
OUT/store/columns/<shard key>/<fingerprint>.parquet   row int64, text, kept columns: the rows of the
                                                      entry's rows.parquet, in its order
OUT/versions/<id>/ids.parquet                         faiss_id, id, shard, row, then text and the kept
                                                      columns, in FAISS id order
```

A side file (``side_files.py``), like a tombstone, lives and goes with its entry; it is written from
the shard's file (streamed, one record batch at a time) after the entry commits, and written again only when a run
asks for a column it lacks. Queries read only the row groups of their hits: ``--show-text`` needs
neither the source shard nor the directory the index was built from.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.documents import window_read
from petal.pipeline.ingest.exact_columns import iter_columns
from petal.pipeline.ingest.int96 import read_arrow_schema
from petal.pipeline.ingest.nested_types import map_leaves
from petal.pipeline.ingest.parquet import (
    ReadStats,
    ShardInfo,
    plain_type,
    read_retrying,
    rows_within,
    stream_batches,
)
from petal.pipeline.ingest.partitions import partition_hint
from petal.pipeline.ingest.remote import RemotePath
from petal.pipeline.reliability.durable import fsync_dir
from petal.pipeline.reliability.errors import BadInputError, ConfigError, quote_names, quote_path, writing
from petal.pipeline.reliability.faults import fault
from petal.pipeline.reliability.parquet_rows import check_rows
from petal.pipeline.reliability.safe_files import UnsafeFileError, check_regular
from petal.pipeline.store.embeddings import EmbeddingStore, StoreEntry, warn
from petal.pipeline.store.side_files import side_file

READ_BATCH_ROWS = 8192
# NOTE: Parquet's writer checks a page's size (1 MB) every write_batch_size values, 1024 by default: 1024 texts of
# 100 KB made one 100 MB page, which the write held ~6 times over (454 MB of Arrow memory for a 67 MB batch) and every
# later read (the version's columns, a query's row group of hits) had to decode whole. 16 costs nothing measurable.
PAGE_CHECK_ROWS = 16


def stored_writer(path: Path, schema: pa.Schema) -> pq.ParquetWriter:
    """A writer of stored text and kept columns (page checksums; pages of ~1 MB, or 16 values where they are larger)."""
    return pq.ParquetWriter(path, schema, write_page_checksum=True, write_batch_size=PAGE_CHECK_ROWS)


def bounded_batches(pf: pq.ParquetFile, names: list[str], most_rows: int = READ_BATCH_ROWS,
                    read: ReadConfig | None = None) -> Iterator[pa.RecordBatch]:
    """``pf``'s ``names`` in record batches of at most ``most_rows`` rows, fewer where its footer says the rows are
    large: the bytes of one batch of the read window (``window_read``: ``read.max_batch_bytes / 8``), since
    the stored-columns phase holds a few batches at once (the batch read, the rows taken from it, the next one
    decoded while the writer still holds the last).

    NOTE: a kept column of 100 KB values read 8192 rows at a time was an 800 MB batch; read in batches of the whole
    budget (64 MB), a shard of 2000 x 100 KB texts took ~580 MB over the embedding's baseline to store its text."""
    size = rows_within(pf.metadata, names, most_rows, window_read(read or ReadConfig()).max_batch_bytes)
    return iter_columns(pf, names, size)  # NOTE: exact names: a kept 'a.b' beside a kept struct 'a'


def columns_path(entry_dir: Path) -> Path:
    return side_file(entry_dir, "columns")


def kept_type(name: str, typed: list[tuple[str, pa.DataType]]) -> pa.DataType:
    """The one type a kept column is stored as, from its type in each shard (``(shard, type)``): the widest when
    they widen (int32 and int64, int and float, string and large_string, an integer and a decimal as a decimal holding
    both, ``_int_decimals``; dictionaries by their values); types that do not (int and string) are a data error
    naming the column, two shards and their types (exit 65)."""
    first, common = typed[0][0], _plain(typed[0][1])
    for shard, type_ in typed[1:]:
        plain = _plain(type_)
        try:
            common = pa.unify_schemas([pa.schema([(name, _int_decimals(common, plain))]),
                                       pa.schema([(name, _int_decimals(plain, common))])],
                                      promote_options="permissive").field(name).type
        except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
            raise BadInputError(f"--keep-columns {name!r}: {shard} has it as {_plain(type_)}, {first} as {common}; "
                                "a kept column needs one type in every shard of the index") from exc
    return common


def _int_decimals(type_: pa.DataType, other: pa.DataType) -> pa.DataType:
    """``type_`` with each integer that ``other`` has as a decimal (at the same place: a list's values, a struct's field
    by name, a map's keys and items) made the decimal of scale 0 that holds every value of it (int64: decimal128(19,
    0), uint64: decimal128(20, 0)), which Arrow then widens with the other decimal exactly.

    NOTE: Arrow widened an integer with a decimal by one digit too few: int64 and decimal128(5, 2) as decimal128(20,
    2), which holds no int64 past 10^18 (int16: decimal128(6, 2), no 10000); the cast failed once every shard was
    embedded, 65 naming a value (1) that fits."""
    if pa.types.is_integer(type_) and pa.types.is_decimal(other):
        info = np.iinfo(type_.to_pandas_dtype())
        return pa.decimal128(len(str(max(int(info.max), -int(info.min)))), 0)
    if pa.types.is_struct(type_) and pa.types.is_struct(other):
        return pa.struct([f.with_type(_int_decimals(f.type, other.field(at).type))
                          if (at := other.get_field_index(f.name)) >= 0 else f for f in type_])
    if pa.types.is_map(type_) and pa.types.is_map(other):
        return pa.map_(type_.key_field.with_type(_int_decimals(type_.key_type, other.key_type)),
                       type_.item_field.with_type(_int_decimals(type_.item_type, other.item_type)), type_.keys_sorted)
    lists = {pa.types.is_list: pa.list_, pa.types.is_large_list: pa.large_list,
             pa.types.is_list_view: pa.list_view, pa.types.is_large_list_view: pa.large_list_view}
    if other.num_fields == 1 and not pa.types.is_struct(other):  # a list of any layout, of the other's values
        for is_kind, make in lists.items():
            if is_kind(type_):
                return make(type_.value_field.with_type(_int_decimals(type_.value_type, other.value_type)))
        if pa.types.is_fixed_size_list(type_):
            return pa.list_(type_.value_field.with_type(_int_decimals(type_.value_type, other.value_type)),
                            type_.list_size)
    return type_


# NOTE: Arrow has no take (nor filter) kernel for the view layouts: their values are stored in the large layout
_UNVIEWED = {pa.string_view(): pa.large_string(), pa.binary_view(): pa.large_binary()}


def _plain(type_: pa.DataType) -> pa.DataType:
    """The type a kept column's values are stored as: a dictionary's values, a view layout's large one (nested
    ones too: ``list<string_view>`` is stored as ``list<large_string>``)."""
    return _no_views(plain_type(type_))


def _no_views(type_: pa.DataType) -> pa.DataType:
    return map_leaves(type_, lambda t: _UNVIEWED.get(t, t))


def _unviewed(values: pa.Array) -> pa.Array:
    stored = _no_views(values.type)
    return values if stored == values.type else values.cast(stored)


@dataclass(frozen=True)
class ColumnsNeed:
    """What a version stores beside the ids: the text column (as ``text``) and the kept columns."""

    text_column: str | None  # None: no text to store (precomputed vectors without a text column)
    keep: tuple[str, ...] = ()

    @property
    def names(self) -> list[str]:
        return (["text"] if self.text_column else []) + list(self.keep)


def kept_schemas(entries: list[StoreEntry], keep: tuple[str, ...], read: ReadConfig,
                 stats: ReadStats | None = None) -> list[tuple[str, pa.Schema, Path]]:
    """Each kept shard's path (``entries``: the live version's shards a run keeps), the schema its ``keep``
    columns will be stored from and the file that holds them: its side file when that holds them all, else its
    file. Under the lock, before any embedding: a file gone or changed since it was embedded is 78
    (``ensure_columns`` would say so after the embedding), a footer without one of the columns 65 naming the shard
    and the column.

    NOTE: a kept shard embedded before ``--keep-columns`` named a column its file lacks was a ``KeyError``
    traceback (exit 1) once the new shards were embedded."""
    found: list[tuple[str, pa.Schema, Path]] = []
    if not keep:
        return found
    for entry in entries:
        source = entry.meta["source"]
        path = columns_path(entry.path)
        schema = _stored_schema(path)
        if schema is None or not set(keep) <= set(schema.names):
            shard = None if "://" in str(source["abs_path"]) else _same_content(Path(source["abs_path"]), source,
                                                                                 read, stats)
            if shard is None:
                raise _gone(source, keep)
            assert isinstance(shard.path, Path), "a kept shard read here is a local file"
            path = shard.path
            schema = read_retrying(path, lambda: _read_schema(path), read, stats,  # noqa: B023 (called at once)
                                   "not a readable Parquet file")
            missing = [c for c in keep if c not in schema.names]
            if missing:
                raise BadInputError(f"{quote_path(source['path'])} (kept from the live version): no column "
                                    f"{missing[0]!r} (--keep-columns); it has: {quote_names(sorted(schema.names))}"
                                    + partition_hint(source["path"], missing))
        found.append((str(source["path"]), schema, path))
    return found


def _gone(source: dict, keep: tuple[str, ...]) -> ConfigError:
    return ConfigError(f"{source['path']} is gone or changed since it was embedded, so its columns "
                       f"{', '.join(keep)} cannot be stored; name it as a SOURCE again or pass --sync")


def _stored_names(path: Path) -> set[str]:
    """The columns side file ``path`` holds (see ``_stored_schema``)."""
    schema = _stored_schema(path)
    return set() if schema is None else set(schema.names)


def _stored_schema(path: Path) -> pa.Schema | None:
    """The schema of the columns side file ``path``; ``None`` when it is missing, unreadable, or not a regular file
    inside the store (a FIFO there is never opened: reading it would block; the side file is written again)."""
    try:
        check_regular(path, path.parent.parent.parent)
        return pq.read_schema(path)
    except (OSError, pa.ArrowException, UnsafeFileError):
        return None


def _read_schema(path: Path | RemotePath) -> pa.Schema:
    """A source's Arrow schema from its footer (an object: ranged reads), the file closed after; INT96 timestamps
    as the reader reads them (``int96.read_arrow_schema``)."""
    fault("read_footer", str(path))
    with contextlib.closing(cast(Any, path.open())) if isinstance(path, RemotePath) \
            else contextlib.nullcontext(path) as source:
        return read_arrow_schema(source)


def ensure_columns(store: EmbeddingStore, entries: list[StoreEntry], need: ColumnsNeed,
                   read_now: dict[str, ShardInfo] | None = None, read: ReadConfig | None = None,
                   stats: ReadStats | None = None, check: Callable[[], None] | None = None) -> list[str]:
    """Every entry gets a side file with ``need``'s columns. ``read_now``: shards of this run (absolute path ->
    the ``ShardInfo`` preflight made: its schema is not read again), whose entries hold their current content.
    Returns shards whose text could not be stored (their file is gone or changed since it was embedded); a kept
    column that cannot be stored is a ``ConfigError`` (78). Sources are read as the rows phase reads them (``read``;
    OS read errors retried and counted in ``stats``): a corrupt page is 65 naming the source, its row group and
    column, an OS read error that persists 74 naming the source, permission denied 66; a write error on the side
    file is 74 naming it. ``check`` runs before each entry and each record batch (a stop signal: it raises, the
    side file being written is removed, those written stay)."""
    read = read or ReadConfig()
    check = check or _no_check
    read_now = read_now or {}
    missing_text: list[str] = []
    if not need.names:
        return missing_text
    for entry in entries:
        path = columns_path(entry.path)
        if set(need.names) <= _stored_names(path):
            continue
        check()
        source = entry.meta["source"]
        shard = read_now.get(str(source["abs_path"]))
        if shard is None and "://" not in str(source["abs_path"]):
            shard = _same_content(Path(source["abs_path"]), source, read, stats)
        if shard is None:
            if need.keep:
                raise _gone(source, need.keep)
            missing_text.append(str(source["path"]))
            continue
        if path.is_dir() and not path.is_symlink():
            # NOTE: a directory in the side file's place (petal's path: ``prune_side_files`` removes one too) is moved
            # out of the way; the write over it was 74 'cannot write .../.<fp>.parquet.tmp-...: Is a directory'
            warn(f"{quote_path(path)} is a directory, not the stored columns of {quote_path(Path(source['path']))}; "
                 "removing it and storing them again")
            with writing(path):
                store.discard(path)
        _write_columns(shard, entry, need, path, read, stats, check)
    return missing_text


def _no_check() -> None:
    return None


def _same_content(shard: Path, source: dict, read: ReadConfig, stats: ReadStats | None) -> ShardInfo | None:
    """A kept shard's file when it holds what its entry was made from (same size, and same mtime or same sha256),
    described by the stat taken before that check (the reader refuses a file changed since: ``check_unchanged``);
    else ``None``."""
    try:
        stat = shard.stat()
    except OSError:
        return None
    if stat.st_size != source["size"]:
        return None
    if stat.st_mtime_ns != source["mtime_ns"]:
        from petal.pipeline.store.embeddings import sha256_file

        def content() -> str:
            fault("read_content", str(shard))
            return sha256_file(shard)

        if read_retrying(shard, content, read, stats, "cannot read it to fingerprint it") != source["sha256"]:
            return None
    return ShardInfo(path=shard, abs_path=str(source["abs_path"]), size=stat.st_size, mtime_ns=stat.st_mtime_ns,
                     num_rows=int(source.get("rows", 0)), num_row_groups=0, has_id_column=False, id_type="",
                     text_type="", ctime_ns=stat.st_ctime_ns, inode=stat.st_ino)


def _write_columns(info: ShardInfo, entry: StoreEntry, need: ColumnsNeed, path: Path, read: ReadConfig,
                   stats: ReadStats | None, check: Callable[[], None]) -> None:
    """Stream the source shard's columns for the rows of ``entry`` (ascending) into ``path`` (atomically).

    NOTE: the source is read through ``stream_batches`` (pipeline/ingest/parquet.py), outside ``writing(path)``:
    what goes wrong reading it names the source (65, 66, 74), only a failed write names ``path`` (74)."""
    rows = pq.read_table(entry.path / "rows.parquet", columns=["row"]).column("row").to_numpy()
    text = [need.text_column] if need.text_column else []
    source_columns = [*text, *need.keep]
    arrow = info.schema  # preflight's (a shard named by this run); else its footer, read as every source read
    if arrow is None:
        source = info.path
        arrow = read_retrying(source, lambda: _read_schema(source), read, stats, "not a readable Parquet file")
    schema = pa.schema([("row", pa.int64()), *[("text", pa.string()) for _ in text],
                        *[(c, _plain(arrow.field(c).type)) for c in need.keep]])

    def decode(start: int, batch: pa.RecordBatch) -> pa.Table | None:
        # NOTE: arrow only, no state: a retry after a read error decodes the batch again
        lo, hi = np.searchsorted(rows, [start, start + batch.num_rows])
        if hi <= lo:
            return None
        take = pa.array(rows[lo:hi] - start)
        values = [_unviewed(batch.column(i)).take(take) for i in range(len(source_columns))]
        if text:
            values[0] = stored_text(values[0])
        return pa.table([pa.array(rows[lo:hi], pa.int64()), *values], schema=schema)

    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = stored_writer(tmp, schema)
    try:
        # NOTE: batches of the read window's size (bounded_batches says why)
        with contextlib.closing(stream_batches(info, source_columns, window_read(read), decode, stats)) as tables:
            for table in tables:  # a read error here names the source
                check()
                if table is not None:
                    with writing(path):
                        writer.write_table(table)
        with writing(path):
            if len(rows) == 0:
                writer.write_table(schema.empty_table())
            writer.close()
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(Exception):
            writer.close()
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def stored_text(values: pa.Array) -> pa.Array:
    """A text column's values as the ``string`` they are stored as: a text run's are text (its rows that were not
    UTF-8 are rejects, never stored); a ``--vectors-column`` run's are stored as the shard holds them, its bytes that
    are not UTF-8 kept as they are, as a string column's (read back with U+FFFD: ``lenient_pylist``), numbers and
    dates as Arrow's text of them.

    NOTE: Arrow's cast of binary to string checks UTF-8: one bad value failed the run as 'corrupt data' (65)."""
    if pa.types.is_fixed_size_binary(values.type) or str(values.type) == "binary_view":
        values = values.cast(pa.binary())
    unchecked = {pa.binary(): pa.string(), pa.large_binary(): pa.large_string()}.get(values.type)
    return (values.view(unchecked) if unchecked is not None else values).cast(pa.string())


def check_stored_text(shards: list[ShardInfo], column: str) -> None:
    """The text column a ``--vectors-column`` run stores beside the vectors can be stored as text in every shard
    (``stored_text``): a nested one (list, struct, map) is 65 naming the shard, column and type, before any work.

    NOTE: its rows were read only after the vectors were stored, where Arrow's 'Unsupported cast' read as 'corrupt
    data' (65) naming a row of a sound file."""
    for info in shards:
        assert info.schema is not None, "preflight records every named shard's schema"
        type_ = plain_type(info.schema.field(column).type)
        try:
            stored_text(pa.array([], type_))
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as exc:
            raise BadInputError(f"{quote_path(info.path)}: text column {column!r} has type {type_}, which cannot be "
                                "stored as text beside the vectors; give --text-column another column (one no shard "
                                "has: no text is stored)") from exc


def entry_columns(entry: StoreEntry, positions: np.ndarray, names: list[str],
                  read: ReadConfig | None = None) -> Iterator[pa.Table]:
    """The side file's ``names`` at ``positions`` (ascending positions into rows.parquet), streamed in batches of
    ``read``'s budget (``bounded_batches``)."""
    path = columns_path(entry.path)
    try:
        pf = pq.ParquetFile(path, page_checksum_verification=True)
        start = 0
        for batch in bounded_batches(pf, names, read=read):
            lo, hi = np.searchsorted(positions, [start, start + batch.num_rows])
            if hi > lo:
                yield pa.Table.from_batches([batch]).take(pa.array(positions[lo:hi] - start))
            start += batch.num_rows
        check_rows(start, pf.metadata.num_rows)  # NOTE: a skipped page shifts every later row (parquet_rows)
    except (OSError, pa.ArrowException) as exc:
        # NOTE: never copied into a version: a damaged page (its checksum) or a cut file is refused, named
        raise BadInputError(f"{path}: cannot read the stored columns ({exc}); remove it and rerun: petal index "
                            "writes it again from its shard") from exc


def version_schema(entries: list[StoreEntry], need: ColumnsNeed) -> pa.Schema | None:
    """The schema of the version's columns file (``None`` when no entry has a side file with ``need``)."""
    if not need.names:
        return None
    schemas = [(str(e.meta["source"]["path"]), schema) for e in entries
               if (schema := _stored_schema(columns_path(e.path))) is not None and set(need.names) <= set(schema.names)]
    if not schemas:
        return None
    first = schemas[0][1]
    return pa.schema([pa.field(n, kept_type(n, [(shard, schema.field(n).type) for shard, schema in schemas]))
                      if n in need.keep else first.field(n) for n in need.names])
