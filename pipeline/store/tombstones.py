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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from petal.pipeline.reliability.durable import fsync_dir
from petal.pipeline.reliability.errors import BadInputError, NoInputError, writing
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


def read_delete_ids(path: Path, id_column: str) -> pa.Array:
    """The distinct ids of ``--delete FILE`` (as strings): its ``id_column``, or its only column."""
    if not Path(path).is_file():
        raise NoInputError(f"--delete {path}: no such file")
    try:
        schema = pq.read_schema(path)
        column = id_column if id_column in schema.names else schema.names[0] if len(schema.names) == 1 else None
        if column is None:
            raise BadInputError(f"--delete {path}: no column {id_column!r} (columns: {', '.join(schema.names)}); "
                                "give a Parquet file with the id column, or a single column")
        values = pq.read_table(path, columns=[column]).column(column)
    except (OSError, pa.ArrowException) as exc:
        raise BadInputError(f"--delete {path}: not a readable Parquet file ({exc})") from exc
    if not (pa.types.is_integer(values.type) or pa.types.is_string(values.type)
            or pa.types.is_large_string(values.type)):
        raise BadInputError(f"--delete {path}: column {column!r} is {values.type}, not integer or string ids")
    if not len(values):
        return pa.array([], pa.string())
    return pc.unique(values.drop_null().cast(pa.string()).combine_chunks())


@dataclass
class Deletion:
    """What ``--delete`` did: ids asked for, found in the store (now deleted), not found."""

    requested: int = 0
    deleted: int = 0
    not_found: int = 0
    rows: int = 0  # store rows newly tombstoned (an id in several shards counts in each)
    sample_not_found: list[str] = field(default_factory=list)


def apply_deletes(entries: list[StoreEntry], ids: pa.Array) -> Deletion:
    """Tombstone every row of ``entries`` whose id is in ``ids``; idempotent (rows deleted already stay)."""
    result = Deletion(requested=len(ids))
    found = np.zeros(len(ids), dtype=bool)
    for entry in entries:
        rows = entry.rows()
        entry_ids = rows.column("id").cast(pa.string())
        hit = pc.is_in(entry_ids, value_set=ids).to_numpy(zero_copy_only=False)
        if not hit.any():
            continue
        found |= pc.is_in(ids, value_set=pc.unique(pc.filter(entry_ids, pa.array(hit)))).to_numpy(zero_copy_only=False)
        old = deleted_rows(entry)
        new = np.union1d(old, rows.column("row").to_numpy()[hit].astype(np.int64))
        if len(new) > len(old):
            _write_tombstone(entry, new)
            result.rows += len(new) - len(old)
    result.deleted = int(found.sum())
    result.not_found = len(ids) - result.deleted
    result.sample_not_found = ids.filter(pa.array(~found)).slice(0, 5).to_pylist()
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
