"""Deleted documents (``petal index --delete IDS.parquet``): tombstones beside store entries.

```
OUT/store/shards/<shard key>/<fingerprint>/           a committed entry (never modified)
OUT/store/deleted/<shard key>/<fingerprint>.parquet   row int64: its rows deleted by --delete
```

A tombstone names rows of one committed entry, so a deletion holds for the shard content it was
made against: every later run (incremental, ``--full`` on the same content, ``petal rebuild``)
leaves those rows out, and a shard whose content changes is indexed as it now is (its new entry has
no tombstone; the old one is pruned with its entry). An id in a shard added later is indexed.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from petal.pipeline.reliability.durable import fsync_dir
from petal.pipeline.reliability.errors import BadInputError, NoInputError, quote_path, quote_text, writing
from petal.pipeline.store.embeddings import StoreEntry
from petal.pipeline.store.side_files import side_file


def tombstone_path(entry_dir: Path) -> Path:
    """Where the tombstone of the entry committed in ``entry_dir`` lives."""
    return side_file(entry_dir, "deleted")


def deleted_rows(entry: StoreEntry) -> np.ndarray:
    """Rows of ``entry`` deleted by ``--delete`` (sorted int64; empty when none)."""
    path = tombstone_path(entry.path)
    if not path.is_file():
        return np.zeros(0, dtype=np.int64)
    return np.sort(pq.read_table(path, columns=["row"]).column("row").to_numpy().astype(np.int64))


def read_delete_ids(path: Path, id_column: str) -> DeleteIds:
    """The ids of ``--delete FILE``: its ``id_column``, or its only column (integer or string values); how they
    are read (as integers or as exact text) is settled against the index's ids (``DeleteIds.typed``)."""
    if not Path(path).is_file():
        raise NoInputError(f"--delete {quote_path(path)}: no such file")
    try:
        schema = pq.read_schema(path)
        column = id_column if id_column in schema.names else schema.names[0] if len(schema.names) == 1 else None
        if column is None:
            raise BadInputError(f"--delete {quote_path(path)}: no column {id_column!r} (columns: "
                                f"{', '.join(schema.names)}); give a Parquet file with the "
                                "id column, or a single column")
        values = pq.read_table(path, columns=[column]).column(column).combine_chunks()
    except (OSError, pa.ArrowException) as exc:
        raise BadInputError(f"--delete {quote_path(path)}: not a readable Parquet file ({exc})") from exc
    if pa.types.is_dictionary(values.type):  # a categorical column: its values
        values = values.dictionary_decode()
    if pa.types.is_null(values.type):  # no values at all
        values = pa.array([None] * len(values), pa.string())
    if not (pa.types.is_integer(values.type) or pa.types.is_string(values.type)
            or pa.types.is_large_string(values.type)):
        raise BadInputError(f"--delete {quote_path(path)}: column {column!r} is {values.type}, not integer "
                            "or string ids")
    return DeleteIds(Path(path), column, values)


INT64_MAX = 2**63 - 1
INTEGER_TEXT = r"^[+-]?[0-9]+$"  # after surrounding whitespace: decimal digits, an optional sign


@dataclass
class DeleteIds:
    """The ids of ``--delete FILE`` as its column holds them (nulls are no id and are ignored).

    The index's ids decide how they are read: integer ids take each value as an integer (an integer column, or
    text that is one: ``7``, ``007``, `` 7 ``, ``+7``; ``7.0``, ``1e1`` or ``seven`` is exit 65 naming the file and
    row); string ids take each value as its exact text (an integer column is exit 65: ``7`` could stand for
    ``"7"`` or ``"007"``). Compared by value, never by an ad hoc text form."""

    path: Path
    column: str
    values: pa.Array  # integer or string, as read

    def typed(self, string_ids: bool) -> pa.Array:
        """The distinct ids asked for, as ``string`` (the index's ids are strings) or ``int64``."""
        where = f"--delete {quote_path(self.path)}: column {self.column!r}"
        values = self.values
        if string_ids:
            if pa.types.is_integer(values.type) and values.null_count < len(values):
                raise BadInputError(f"{where} holds integers ({values.type}), but the index's ids are strings: an "
                                    "integer matches no string id exactly (7 could be \"7\" or \"007\"); give the "
                                    "ids as strings, as the index holds them")
            return pc.unique(values.drop_null().cast(pa.string()))
        if pa.types.is_integer(values.type):
            valid = values.drop_null()
            if pa.types.is_uint64(valid.type) and len(valid):
                over = pc.greater(valid, pa.scalar(INT64_MAX, pa.uint64()))
                if pc.any(over).as_py():
                    self._refuse(where, pc.index(pc.greater(values, pa.scalar(INT64_MAX, pa.uint64())), True).as_py(),
                                 "is above the largest id petal stores (int64)")
            return pc.unique(valid.cast(pa.int64()))
        text = pc.replace_substring_regex(pc.utf8_trim_whitespace(values), r"^\+", "")
        ok = pc.match_substring_regex(text, INTEGER_TEXT)
        bad = pc.and_(pc.is_valid(values), pc.invert(pc.fill_null(ok, False)))
        if pc.any(bad).as_py():
            self._refuse(where, pc.index(bad, True).as_py(), "is not an integer, and the index's ids are integers")
        valid = text.drop_null()
        try:
            ints = valid.cast(pa.int64())
        except pa.ArrowInvalid:  # digits past int64
            row = next(i for i, v in enumerate(text.to_pylist())
                       if v is not None and not -INT64_MAX - 1 <= int(v) <= INT64_MAX)
            self._refuse(where, row, "is out of the int64 range of the index's ids")
        return pc.unique(ints)

    def _refuse(self, where: str, row: int, why: str) -> NoReturn:
        raise BadInputError(f"{where}: row {row} ({quote_text(self.values[row].as_py())}) {why}; ids are compared "
                            "by value, as the index holds them")


def string_ids(entries: list[StoreEntry]) -> bool:
    """True when the version of ``entries`` holds string ids (an entry of string ids makes every id a string, as
    the index's ``ids.parquet`` does: pipeline/index/source.py)."""
    return any(e.meta.get("id_type") == "string" for e in entries)


@dataclass
class Deletion:
    """What ``--delete`` did: ids asked for, found (now deleted), not found."""

    requested: int = 0
    deleted: int = 0
    not_found: int = 0
    rows: int = 0  # store rows newly tombstoned (an id in several shards counts in each)
    missing: pa.Array = field(default_factory=lambda: pa.array([], pa.string()))  # the ids not found, as text
    pending: list[tuple[StoreEntry, np.ndarray]] = field(default_factory=list)  # tombstones not written yet

    def pending_counts(self) -> dict[Path, int]:
        """The deleted rows each entry will have once the pending tombstones are written (by entry path)."""
        return {entry.path: len(rows) for entry, rows in self.pending}

    def write(self) -> None:
        """Write the pending tombstones (each atomically; idempotent when a run is repeated)."""
        for entry, rows in self.pending:
            _write_tombstone(entry, rows)
        self.pending = []

    @property
    def sample_not_found(self) -> list[str]:
        return self.missing.slice(0, 5).to_pylist()

    def gone_with_shards(self, live: pa.Array | pa.ChunkedArray | None) -> int:
        """Ids not found in the new version's entries that the live version held (``live``: its ids as text): they
        leave with a shard this run drops (``--sync``) or replaces, as asked; counted deleted. Returns how many."""
        if live is None or not len(self.missing) or not len(live):
            return 0
        held = pc.is_in(self.missing, value_set=pc.unique(live)).to_numpy(zero_copy_only=False)
        self.missing = self.missing.filter(pa.array(~held))
        self.deleted += int(held.sum())
        self.not_found = len(self.missing)
        return int(held.sum())


def apply_deletes(entries: list[StoreEntry], asked: DeleteIds, write: bool = True) -> Deletion:
    """Tombstone every row of ``entries`` whose id is in ``asked``; idempotent (rows deleted already stay). The ids
    are read as the version's ids are (``DeleteIds.typed``), checked before any tombstone is written. ``write``
    False: the tombstones wait in ``Deletion.pending`` for ``Deletion.write()`` (after the run's last check)."""
    as_text = string_ids(entries)
    ids = asked.typed(as_text)
    id_type = pa.string() if as_text else pa.int64()
    result = Deletion(requested=len(ids))
    found = np.zeros(len(ids), dtype=bool)
    for entry in entries:
        rows = entry.rows()
        entry_ids = rows.column("id").cast(id_type)
        hit = pc.is_in(entry_ids, value_set=ids).to_numpy(zero_copy_only=False)
        if not hit.any():
            continue
        found |= pc.is_in(ids, value_set=pc.unique(pc.filter(entry_ids, pa.array(hit)))).to_numpy(zero_copy_only=False)
        old = deleted_rows(entry)
        new = np.union1d(old, rows.column("row").to_numpy()[hit].astype(np.int64))
        if len(new) > len(old):
            result.pending.append((entry, new))
            result.rows += len(new) - len(old)
    result.deleted = int(found.sum())
    result.not_found = len(ids) - result.deleted
    result.missing = ids.filter(pa.array(~found)).cast(pa.string())
    if write:
        result.write()
    return result


def _write_tombstone(entry: StoreEntry, rows: np.ndarray) -> None:
    path = tombstone_path(entry.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    with writing(path):
        pq.write_table(pa.table({"row": pa.array(rows, pa.int64())}), tmp, write_page_checksum=True)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
