"""Document ids seen in more than one shard.

The rule (README, "Duplicate ids"): a document id present in several shards keeps the vector of the
shard whose absolute path sorts last; the others are ``superseded`` (counted in the summary line and
the report). ``--strict`` refuses them instead (exit 65), naming the id and two of its shards.
"""

from __future__ import annotations

import contextlib

import pyarrow as pa
import pyarrow.compute as pc

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.parquet import ReadStats, ShardInfo, integer_ids, stream_batches, without_undecodable_ids
from petal.pipeline.reliability.errors import BadInputError, quote_path, quote_text


def check_cross_shard_duplicates(shards: list[ShardInfo], read: ReadConfig, stats: ReadStats | None = None) -> None:
    """``BadInputError`` (65) when an id occurs in two shards (duplicates inside one shard are bad rows). The id
    columns are streamed by the rows' reader (local files and objects alike): an OS read error is retried (counted
    in ``stats``) then 74, permission denied 66, a corrupt page 65 naming the file, row group and column."""
    with_ids = [(i, s) for i, s in enumerate(shards) if s.has_id_column]
    if len(with_ids) < 2:
        return
    id_type = pa.string() if any(not integer_ids(s.id_type) for _, s in with_ids) else pa.int64()

    def distinct(_row: int, batch: pa.RecordBatch) -> pa.Array:
        # NOTE: an id that is not UTF-8 is a bad row of its shard (``invalid_utf8_id``), never a duplicate
        return pc.unique(without_undecodable_ids(batch.column(0).drop_null()).cast(id_type))

    parts = []
    for i, shard in with_ids:
        with contextlib.closing(stream_batches(shard, [read.id_column], read, distinct, stats)) as batches:
            found = list(batches)
        column = pc.unique(pa.chunked_array(found, id_type)) if found else pa.array([], id_type)
        parts.append(pa.table({"id": column, "shard": pa.array([i] * len(column), pa.int32())}))
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
        f"{quote_path(shards[first].path)} and {quote_path(shards[last].path)} (without --strict the shard "
        "whose path sorts last wins and the others are counted as superseded)")
