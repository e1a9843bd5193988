"""Document ids seen in more than one shard.

The rule (README, "Duplicate ids"): a document id present in several shards keeps the vector of the
shard whose absolute path sorts last; the others are ``superseded`` (counted in the summary line and
the report). ``--strict`` refuses them instead (exit 65), naming the id and two of its shards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.parquet import ReadStats, ShardInfo, stream_batches, string_ids, without_undecodable_ids
from petal.pipeline.reliability.errors import BadInputError, quote_path, quote_text


def check_cross_shard_duplicates(shards: list[ShardInfo], read: ReadConfig, stats: ReadStats | None = None,
                                 kept: Sequence[tuple[str, pa.Array | pa.ChunkedArray]] = ()) -> None:
    """``BadInputError`` (65) when an id occurs in two shards (duplicates inside one shard are bad rows): the shards
    a run names and those it keeps from the live version (``kept``: each one's path and the ids it holds there).
    The id columns are streamed by the rows' reader (local files and objects alike): an OS read error is retried
    (counted in ``stats``) then 74, permission denied 66, a corrupt page 65 naming the file, row group and column.

    NOTE: the named shards alone were compared: an id of a named shard that a kept shard also holds was superseded
    silently under ``--strict`` (and ``--vectors-column --strict`` compared no shards)."""
    with_ids = [(i, s) for i, s in enumerate(shards) if s.has_id_column]
    if len(with_ids) + len(kept) < 2:
        return
    strings = any(string_ids(s.id_type) for _, s in with_ids) or any(
        not pa.types.is_integer(ids.type) for _, ids in kept)
    id_type = pa.string() if strings else pa.int64()
    names = [str(s.path) for s in shards] + [path for path, _ in kept]

    def distinct(_row: int, batch: pa.RecordBatch) -> pa.Array:
        # NOTE: an id that is not UTF-8 is a bad row of its shard (``invalid_utf8_id``), never a duplicate
        return pc.unique(without_undecodable_ids(batch.column(0).drop_null()).cast(id_type))

    parts = []
    for i, shard in with_ids:
        with contextlib.closing(stream_batches(shard, [read.id_column], read, distinct, stats)) as batches:
            found = list(batches)
        column = pc.unique(pa.chunked_array(found, id_type)) if found else pa.array([], id_type)
        parts.append(pa.table({"id": column, "shard": pa.array([i] * len(column), pa.int32())}))
    for k, (_, ids) in enumerate(kept, start=len(shards)):
        column = pc.unique(ids.drop_null().cast(id_type))
        parts.append(pa.table({"id": column, "shard": pa.array([k] * len(column), pa.int32())}))
    table = pa.concat_tables(parts)
    counts = table.group_by("id").aggregate([("shard", "count")])
    dup = counts.filter(pc.greater(counts.column("shard_count"), 1))
    if dup.num_rows == 0:
        return
    doc_id = dup.column("id")[0].as_py()
    where = table.filter(pc.equal(table.column("id"), pa.scalar(doc_id, id_type))).column("shard").to_pylist()
    first, last = sorted(where)[0], sorted(where)[-1]
    raise BadInputError(
        f"--strict: {dup.num_rows} id(s) occur in more than one shard, e.g. id {quote_text(doc_id)} in "
        f"{quote_path(names[first])} and {quote_path(names[last])}"
        f"{' (kept from the live version)' if last >= len(shards) else ''} (without --strict the shard "
        "whose path sorts last wins and the others are counted as superseded)")
