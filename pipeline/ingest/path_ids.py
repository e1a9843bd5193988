"""Ids spelled from a shard's path: a shard without an id column gives its rows the ids ``<shard path>:<row>``, the
path as the run that embedded it named it (``read_rows``, ``read_vectors``). Two different files named the same way
(``data/x.parquet`` from two working directories, a ``latest`` symlink pointed elsewhere between two runs) would give
the same ids, and one file's documents would supersede the other's: a run refuses that (65) before it embeds anything.

The prefix of a shard the run embeds is the path it names it by; of a store entry it reuses or keeps, the prefix its
ids were given (``entry.json``'s ``id_prefix``; an entry of an older petal, from its ``rows.parquet``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from petal.pipeline.ingest.parquet import ShardInfo
from petal.pipeline.reliability.errors import BadInputError, PetalIOError, quote_path, quote_text
from petal.pipeline.reliability.parquet_rows import read_table
from petal.pipeline.store.embeddings import ID_PREFIX_KEY, StoreEntry, id_spelling


def entry_id_prefix(entry: StoreEntry) -> str | None:
    """The ``<shard>`` of the ``<shard>:<row>`` ids a committed entry holds, ``None`` when they came from an id
    column (or it holds no ids). An entry of an older petal (no ``id_prefix``): string ids that all start with its
    recorded source path and ``:`` (the footer's min and max; the ids themselves where it has no statistics)."""
    meta: dict[str, Any] = entry.meta
    if entry.num_embedded == 0:  # no id of it is in the index
        return None
    if ID_PREFIX_KEY in meta:
        prefix = meta[ID_PREFIX_KEY]
        return str(prefix) if prefix is not None else None
    if meta.get("id_type") != "string":
        return None
    prefix = str(meta["source"]["path"])
    return prefix if _all_start_with(entry, f"{prefix}:") else None


def _all_start_with(entry: StoreEntry, start: str) -> bool:
    path = entry.path / "rows.parquet"
    try:
        return _ids_start_with(path, start)
    except OSError as exc:  # NOTE: read_entry has read its footer: a disk failing since
        raise PetalIOError(f"{quote_path(path)}: cannot read the store entry's ids ({exc.strerror or exc})") from exc


def _ids_start_with(path: Path, start: str) -> bool:
    meta = pq.read_metadata(path)
    column = meta.schema.to_arrow_schema().get_field_index("id")
    bounds = []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(column).statistics
        if stats is None or not stats.has_min_max or not isinstance(stats.min, str):
            break  # NOTE: pyarrow drops statistics over 4 KiB: the ids are read instead
        bounds += [stats.min, stats.max]
    else:
        return all(bound.startswith(start) for bound in bounds)
    ids = read_table(path, columns=["id"]).column("id").drop_null().to_pylist()
    return bool(ids) and all(isinstance(i, str) and i.startswith(start) for i in ids)


def check_path_ids(named: Sequence[ShardInfo], named_entries: Sequence[StoreEntry | None],
                   kept: Sequence[ShardInfo], kept_entries: Sequence[StoreEntry]) -> None:
    """``BadInputError`` (65) when two different files (their resolved paths, or URIs) would hold the same
    ``<shard>:<row>`` ids in the index: the shards the run names (``named_entries``: the entry each reuses, ``None``
    for one it embeds) and those it keeps from the live version. A pair of kept shards alone is left as the live
    version holds it: this run adds no loss.

    NOTE: without it, the file whose absolute path sorts last superseded the other's documents, counted but never
    refused, and an additive run from another working directory replaced a whole shard's documents."""
    seen: dict[str, tuple[ShardInfo, bool]] = {}  # prefix -> (shard, named)
    shards = [(info, entry, True) for info, entry in zip(named, named_entries, strict=True)]
    shards += [(info, entry, False) for info, entry in zip(kept, kept_entries, strict=True)]
    for info, entry, is_named in shards:
        prefix = entry_id_prefix(entry) if entry is not None else id_spelling(info) if info.num_rows else None
        if prefix is None:
            continue
        other = seen.setdefault(prefix, (info, is_named))
        if other[0].abs_path == info.abs_path or not (is_named or other[1]):
            continue
        raise BadInputError(_collision(prefix, other, (info, is_named)))


def _collision(prefix: str, first: tuple[ShardInfo, bool], second: tuple[ShardInfo, bool]) -> str:
    def said(info: ShardInfo, is_named: bool) -> str:
        return f"{quote_path(info.abs_path)}{'' if is_named else ' (kept from the live version)'}"

    kept = [quote_path(info.abs_path) for info, is_named in (first, second) if not is_named]
    return (f"two different files would give the same document ids {quote_text(f'{prefix}:<row>')}: "
            f"{said(*first)} and {said(*second)} have no id column, and ids without one are the shard's path as a "
            "run named it, so one file's documents would replace the other's; give the shards an id column "
            "(--id-column)" + (f", or pass --sync to drop {kept[0]} from the index" if kept else "")
            + ", or name one of them by a path that differs (an absolute path)")
