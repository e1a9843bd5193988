"""What a run keeps and removes: additive runs, ``--sync``, the ``--max-removed`` guard.

A shard's identity is its absolute path (symlinks resolved), as the store keys it. Additive (the
default): the live version's shards that this run does not name are kept, from their committed
store entries (their files need not exist any more); named shards are added or replaced. ``--sync``:
the new version holds exactly the shards named. The new version's shards are in absolute-path order
whichever runs brought them in, so the same set of shards always gives the same index.

The guard: documents of the live version that only shards dropped by ``--sync`` held (the ids
``--delete`` asked for aside) may not exceed ``--max-removed`` (default 0, 10% of the live version
with ``--sync``); over it, the run fails with exit 65 before anything is published, naming the
shards and ids it would remove. A replaced shard's content is what the user gave: documents gone
from it are counted (``replaced``), not refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from petal.pipeline.config import RemovalLimit
from petal.pipeline.ingest.parquet import ShardInfo
from petal.pipeline.ingest.remote import RemotePath, names_no_endpoint, names_no_namenode
from petal.pipeline.layout import OutputDir
from petal.pipeline.manifest import Manifest, ShardRecord
from petal.pipeline.reliability.errors import BadInputError, ConfigError, PetalError
from petal.pipeline.reliability.parquet_rows import read_table
from petal.pipeline.reliability.safe_files import check_regular
from petal.pipeline.store.embeddings import EmbeddingStore, StoreEntry, check_row_files
from petal.pipeline.store.tombstones import DeleteIds, deleted_as_text, deleted_rows

SAMPLE_IDS = 5


def kept_records(previous: Manifest | None, named: list[ShardInfo], sync: bool) -> list[ShardRecord]:
    """The live version's shard records this run keeps without naming them (none with ``--sync``)."""
    if previous is None or sync:
        return []
    named_paths = {info.abs_path for info in named}
    return [s for s in previous.shards if s.abs_path not in named_paths]


def kept_vectors(records: list[ShardRecord]) -> int:
    """The vectors kept shards can add to the index at most (their embedded rows)."""
    return sum(r.embedded for r in records)


def kept_shard(record: ShardRecord, entry: StoreEntry) -> ShardInfo:
    """A kept shard as the manifest recorded it (its file is not read; it may be gone)."""
    id_type = str(entry.meta.get("id_type", ""))
    path: Any = Path(record.path)
    if "://" in record.abs_path:  # an object (pipeline/ingest/remote.py): its safe URI, not reopened here
        path = RemotePath(filesystem=None, path=record.abs_path.split("://", 1)[1], uri=record.path)
    return ShardInfo(path=path, abs_path=record.abs_path, size=record.size, mtime_ns=record.mtime_ns,
                     num_rows=record.rows, num_row_groups=0, has_id_column=bool(id_type), id_type=id_type,
                     text_type="", namenode_unknown=names_no_namenode(record.abs_path) and not record.default_namenode,
                     endpoint_unknown=names_no_endpoint(record.abs_path) and not record.default_endpoint)


def kept_entries(store: EmbeddingStore, records: list[ShardRecord], out: Path) -> list[StoreEntry]:
    """The committed store entries of kept shards; a missing one is a ``ConfigError`` (78), a damaged one a
    ``BadInputError`` (65) naming it, as ``petal rebuild`` says it: this run has no source to embed the shard
    again from, so the entry is left where it is (moved out, the next run said it was missing). Checked as a run with
    nothing to publish checks its entries (``lookup(verify=False)``): only the files whose stat changed since the
    commit (or the last full check) are hashed. NOTE: hashed whole, adding one small shard to a large store read every
    byte of the store on top of the build, and did so again on every idle run over a part of the sources."""
    entries = []
    for record in records:
        keeps = (f"{record.path}, which the live version holds and this run keeps (additive); name it as a SOURCE "
                 "to embed it again, or pass --sync to drop what is not named")
        try:
            entry = store.lookup(record.abs_path, record.entry, repair=False, verify=False)
        except BadInputError as exc:
            raise BadInputError(f"{exc}: it holds the embeddings of {keeps}") from exc
        if entry is None:
            raise ConfigError(f"{out}: the store has no embeddings for {keeps}")
        check_row_files(entry)  # NOTE: read before the build (--strict, --delete, the guard): 65, not a pyarrow error
        entries.append(entry)
    return entries


def kept_ids(kept: list[StoreEntry]) -> list[tuple[str, pa.ChunkedArray]]:
    """Each kept shard's path and the ids it gives the version (its embedded rows, less ``--delete``'s; as text)."""
    return [(str(entry.meta["source"]["path"]), live_ids([entry])) for entry in kept]


@dataclass
class Removal:
    """Documents of the live version the new one would not hold."""

    live_documents: int = 0
    documents: int = 0  # held only by shards this run drops (--sync): what the guard counts
    replaced: int = 0  # gone from a shard this run replaces (its new content no longer has them)
    shards: list[str] = field(default_factory=list)  # shards dropped (--sync)
    sample_ids: list[Any] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"documents": self.documents, "of": self.live_documents, "replaced": self.replaced,
                "shards": self.shards, "sample_ids": self.sample_ids}


def live_ids(entries: list[StoreEntry]) -> pa.ChunkedArray:
    """Every id the entries index (after ``--delete``), as strings, with repeats."""
    columns = []
    for entry in entries:
        rows = pq.read_table(entry.path / "rows.parquet", columns=["row", "id"])
        dead = deleted_rows(entry)
        ids = rows.column("id").cast(pa.string())
        if len(dead):
            ids = ids.filter(pa.array(~np.isin(rows.column("row").to_numpy(), dead)))
        columns.extend(ids.chunks)
    return pa.chunked_array(columns, pa.string())


def read_ids_entry(store: EmbeddingStore, record: ShardRecord, what: str) -> StoreEntry | None:
    """A live shard's store entry read for its ids only (the removal guard): its files checked by their stat, as a
    kept shard's (``lookup(verify=False)``); a damaged one is said (``what``) and ``None``, left where it is (nothing
    embeds it again here; pruning after the publish removes what no version holds). NOTE: was ``lookup``'s repair:
    every dropped shard's vectors hashed, and a damaged entry warned 'embedding the shard again' in a run that
    embedded nothing, and was moved out of the store."""
    try:
        return store.lookup(record.abs_path, record.entry, repair=False, verify=False)
    except BadInputError as exc:
        from petal.pipeline.store.embeddings import warn

        warn(f"{exc}: it holds the embeddings of {record.path}, {what}")
        return None


def dropped_entries(store: EmbeddingStore, previous: Manifest | None,
                    kept: list[ShardInfo]) -> list[StoreEntry] | None:
    """Store entries of the live version's shards the new version does not hold (still in the store: pruning
    comes after the publish); ``None`` when one is missing or damaged: the guard then counts from the manifest
    (``removed_by_counts``: a shard whose ids cannot be read never lowers the count)."""
    held = {info.abs_path for info in kept}
    found = [read_ids_entry(store, s, "which this run drops; the removal guard counts from the manifest instead")
             for s in (previous.shards if previous is not None else ()) if s.abs_path not in held]
    return None if any(entry is None for entry in found) else [e for e in found if e is not None]


def live_version_ids(out: OutputDir) -> pa.ChunkedArray | None:
    """The live version's ids (its ``ids.parquet``) as text; ``None`` when there is no live version or its ids
    cannot be read (``--full`` over a damaged one, which the run rebuilds from the store): nothing to compare."""
    version = out.current_version()
    if version is None:
        return None
    ids_file = out.version_dir(version) / "ids.parquet"
    try:
        check_regular(ids_file, out.root)  # NOTE: never a FIFO, never a symlink out of OUT
        return read_table(ids_file, columns=["id"]).column("id").cast(pa.string())  # every row (parquet_rows)
    except (OSError, PetalError, pa.ArrowException):
        return None


def live_version_documents(out: OutputDir, previous: Manifest | None,
                           store: EmbeddingStore) -> pa.ChunkedArray | None:
    """The live version's ids as text: its ``ids.parquet``, else (unreadable, damaged) the ids of the store
    entries it was built from (its manifest's shards, after their tombstones: the same documents). ``None``
    when neither can be read."""
    ids = live_version_ids(out)
    if ids is not None or previous is None:
        return ids
    entries = [read_ids_entry(store, s, "which the live version holds; the removal guard counts from the manifest "
                              "instead") for s in previous.shards]
    if any(entry is None for entry in entries):
        return None
    try:
        return pa.chunked_array([pc.unique(live_ids([e for e in entries if e is not None]))], pa.string())
    except (OSError, PetalError, pa.ArrowException):
        return None


def removed_by_counts(previous: Manifest, held: set[str], dropped_shards: list[str]) -> Removal:
    """The guard's count when the live version's ids cannot be read from it or its store entries: every document
    of a shard the run drops counts as removed (its manifest record: embedded rows less deleted ones), an upper
    bound (a document another shard also holds stays), so a damaged version never lets a run past the guard."""
    dropped = [s for s in previous.shards if s.abs_path not in held]
    live = previous.index.num_vectors
    return Removal(live_documents=live, documents=min(live, sum(max(0, s.embedded - s.deleted) for s in dropped)),
                   shards=dropped_shards)


def removed_documents(before: pa.ChunkedArray, entries: list[StoreEntry], deleted: DeleteIds | None,
                      dropped: list[StoreEntry], dropped_shards: list[str]) -> Removal:
    """What the new version (``entries``) loses against the live one (``before``: its ids as text), not counting
    the ``deleted`` ids asked for; split into the documents of ``dropped`` shards and replaced ones."""
    lost = pc.filter(before, pc.invert(pc.is_in(before, value_set=pc.unique(live_ids(entries)))))
    if deleted is not None and len(lost):  # the ids asked for, read as apply_deletes read them (7 for "007")
        asked = deleted.typed(deleted_as_text(entries, deleted)).cast(pa.string())
        lost = pc.filter(lost, pc.invert(pc.is_in(lost, value_set=asked)))
    in_dropped = (pc.is_in(lost, value_set=pc.unique(live_ids(dropped))) if dropped
                  else pa.array(np.zeros(len(lost), dtype=bool)))
    removed = pc.filter(lost, in_dropped)
    return Removal(live_documents=len(before), documents=len(removed), replaced=len(lost) - len(removed),
                   shards=dropped_shards, sample_ids=removed.slice(0, SAMPLE_IDS).to_pylist())


def check_removal(removal: Removal, limit: RemovalLimit, sync: bool) -> None:
    """Exit 65 when ``removal`` is over ``limit`` (before anything is published)."""
    allowed = limit.allowed(removal.live_documents)
    if removal.documents <= allowed:
        return
    share = removal.documents / max(removal.live_documents, 1)
    what = []
    if removal.shards:
        names = ", ".join(removal.shards[:SAMPLE_IDS]) + (" ..." if len(removal.shards) > SAMPLE_IDS else "")
        what.append(f"{len(removal.shards)} shards not named with --sync ({names})")
    if removal.sample_ids:
        what.append(f"ids such as {', '.join(map(str, removal.sample_ids))}")
    else:  # removed_by_counts: the live version's ids could not be read
        what.append("counted from the live version's manifest (its ids cannot be read): every document of those "
                    "shards")
    mode = "--sync" if sync else "an additive run"
    raise BadInputError(
        f"this run would remove {removal.documents} of the {removal.live_documents} documents of the live version "
        f"({share:.1%}), over --max-removed {limit} for {mode}: {'; '.join(what)}. Nothing was published; "
        "pass --max-removed N (or a fraction, e.g. 50%) to allow it, or name the missing shards")
