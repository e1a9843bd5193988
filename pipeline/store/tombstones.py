"""Deleted documents (``petal index --delete IDS.parquet``): tombstones beside store entries.

```
OUT/store/shards/<shard key>/<fingerprint>/           a committed entry (never modified)
OUT/store/deleted/<shard key>/<fingerprint>.parquet   row int64: its rows deleted by --delete
```

A tombstone names rows of one committed entry, so a deletion holds for the shard content it was
made against, while the shard stays in the index with that content: every later run (incremental, ``--full`` on
the same content, ``petal rebuild``) leaves those rows out. A shard whose content changes, or that leaves the index
(``--sync``), is indexed as it is from then on: a run that reuses an entry the live version does not hold its shard
at (the content reverted to an older one, the shard added back) plans it no deleted rows, and its tombstone is
replaced by an empty one with the version that publishes it (``carry_deletions``; an old entry is kept for
rollbacks, ``--keep-versions``, so its tombstone outlives the deletion). An id in a shard added later is indexed.

A deletion takes effect with the version that publishes it, never before (a run that fails, is refused or is
killed deletes nothing), and holds once that version is live (a crash after the pointer swap loses nothing):

1. planned in memory (``apply_deletes``, ``carry_deletions``): the build reads the planned rows from the entries it is
   given (``Deletion.apply`` -> ``PlannedEntry``), and the version's manifest counts them (``ShardRecord.deleted``);
2. staged just before the publish, fsynced, beside the tombstone they will replace:
   ``OUT/store/deleted/<shard key>/<fingerprint>.staged-<version>.parquet`` (the full new set of rows);
3. the pointer swap is the commit: a staged tombstone is in force (``deleted_rows``) exactly when the live
   version is the one it was staged for and its manifest records the entry with that many deleted rows;
4. after the publish, each staged file is renamed over the entry's tombstone (``Deletion.commit``); what a
   crash leaves is settled under the lock by the next writer, ``petal index`` or ``petal rebuild``
   (``settle_tombstones``): renamed if in force, else removed.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.parquet import ReadStats, check_unique_columns, first_undecodable, read_ids, read_retrying
from petal.pipeline.layout import OutputDir
from petal.pipeline.reliability.durable import fsync_dir
from petal.pipeline.reliability.errors import (
    BadInputError,
    NoInputError,
    PetalError,
    PetalIOError,
    io_error,
    one_line,
    quote_names,
    quote_path,
    quote_text,
    writing,
)
from petal.pipeline.reliability.faults import fault
from petal.pipeline.reliability.parquet_rows import read_table
from petal.pipeline.reliability.safe_files import input_file_size
from petal.pipeline.store.embeddings import DamagedEntry, EmbeddingStore, StoreEntry, shard_key
from petal.pipeline.store.side_files import real_dirs, side_file

if TYPE_CHECKING:
    from petal.pipeline.manifest import Manifest, ShardRecord

STAGED = ".staged-"  # <fingerprint>.staged-<version>.parquet: a tombstone waiting for its version's publish
VERSION_KEY = b"petal.version"  # a tombstone's Parquet metadata: the version that published it


def tombstone_path(entry_dir: Path) -> Path:
    """Where the tombstone of the entry committed in ``entry_dir`` lives."""
    return side_file(entry_dir, "deleted")


def staged_path(entry_dir: Path, version: str) -> Path:
    """Where the tombstone a run publishes as ``version`` waits for the publish (beside the entry's tombstone)."""
    return tombstone_path(entry_dir).with_name(f"{entry_dir.name}{STAGED}{version}.parquet")


@dataclass(frozen=True, eq=False)
class PlannedEntry(StoreEntry):
    """A store entry with the tombstone a run has planned for it and not written yet (``planned``: every deleted
    row, earlier ones included): the build, the manifest and the report read these rows (``deleted_rows``)."""

    planned: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)


def deleted_rows(entry: StoreEntry) -> np.ndarray:
    """Rows of ``entry`` deleted by ``--delete`` (sorted int64; empty when none): the rows a run plans
    (``PlannedEntry``), else a staged tombstone the live version was built with, else the entry's tombstone."""
    if isinstance(entry, PlannedEntry):
        return entry.planned
    staged = staged_in_force(entry.path)
    if staged is not None:
        return _read_rows(staged)
    path = tombstone_path(entry.path)
    if not path.is_file():
        return np.zeros(0, dtype=np.int64)
    return _read_rows(path)


def tombstoned(entry: StoreEntry) -> int:
    """Rows of ``entry`` removed by ``--delete`` (now or by an earlier run): what a version built from it leaves out
    and its manifest counts (``ShardRecord.deleted``), ``petal index`` and ``petal rebuild`` alike."""
    return len(deleted_rows(entry))


def _read_rows(path: Path) -> np.ndarray:
    return np.sort(pq.read_table(path, columns=["row"]).column("row").to_numpy().astype(np.int64))


def _staged_files(entry_dir: Path) -> list[Path]:
    key_dir = tombstone_path(entry_dir).parent
    if not key_dir.is_dir():
        return []
    return sorted(key_dir.glob(f"{entry_dir.name}{STAGED}*.parquet"))


@dataclass(frozen=True)
class LiveDeletions:
    """What the live version was built with, for judging staged tombstones: its id (``None``: no live version)
    and ``counts``: ``(shard key, entry fingerprint) -> deleted rows`` of its shards."""

    version: str | None
    counts: dict[tuple[str, str], int]


def staged_in_force(entry_dir: Path, live: LiveDeletions | None = None) -> Path | None:
    """The staged tombstone of the entry in ``entry_dir`` that the live version was built with, if any: the one
    staged for the live version, holding as many rows as its manifest records deleted for the entry. ``live``:
    ``live_deletions`` of the output (read here when not given). NOTE: a staged tombstone may hold fewer rows than
    the entry's (one that ends a deletion holds none), so its count alone does not prove its run published: a killed
    run's empty one matched a version rolled back by hand that records 0, and ended a deletion that holds there."""
    if not _staged_files(entry_dir):
        return None
    if live is None:
        live = live_deletions(OutputDir(entry_dir.parent.parent.parent.parent))  # OUT/store/shards/<key>/<fp>
    if live is None or live.version is None:
        return None
    want = live.counts.get((entry_dir.parent.name, entry_dir.name))
    path = staged_path(entry_dir, live.version)
    if want is None or not path.is_file():
        return None
    try:
        return path if pq.read_metadata(path).num_rows == want else None
    except (OSError, pa.ArrowException):  # a torn file (never in force: staged files are fsynced first)
        return None


def live_deletions(out: OutputDir) -> LiveDeletions | None:
    """The live version's id and deleted rows by store entry; no version and no counts without a live version,
    ``None`` when it cannot be read (no staged tombstone is in force either way)."""
    try:
        manifest = out.current_manifest()
    except (OSError, PetalError):
        return None
    if manifest is None:
        return LiveDeletions(None, {})
    return LiveDeletions(manifest.version, {(shard_key(s.abs_path), s.entry): int(s.deleted) for s in manifest.shards})


def settle_staged(out: OutputDir) -> tuple[int, int]:
    """What a run that died between staging and committing its tombstones left (call with the writer lock
    held, before anything reads tombstones): a staged tombstone the live version was built with becomes the
    entry's tombstone (the deletion was published); any other is removed (its run published nothing).
    Returns ``(committed, removed)``."""
    root = out.store_dir / "deleted"
    if not root.is_dir():
        return 0, 0
    staged = sorted(path for key_dir in real_dirs(root) for path in key_dir.glob(f"*{STAGED}*.parquet"))
    if not staged:
        return 0, 0
    live = live_deletions(out)
    if live is None:
        return 0, 0  # NOTE: a live version that cannot be read decides nothing: left as they are (not in force)
    committed = removed = 0
    for path in staged:
        fingerprint = path.name.split(STAGED)[0]
        entry_dir = out.store_dir / "shards" / path.parent.name / fingerprint
        if staged_in_force(entry_dir, live) == path:
            _commit(path, tombstone_path(entry_dir))
            committed += 1
        else:
            path.unlink(missing_ok=True)
            removed += 1
    for key_dir in {p.parent for p in staged}:
        fsync_dir(key_dir)
    return committed, removed


def settle_tombstones(out: OutputDir, say: Callable[[str], None]) -> tuple[int, int]:
    """Every writer of ``out`` (``petal index``, ``petal rebuild``), under the lock before anything reads tombstones:
    the staged tombstones of a run that died around its publish are committed if the live version was built with
    them, else removed (``settle_staged``), each outcome told through ``say``. A disk error is 74 naming
    ``store/deleted``. Returns ``(committed, removed)``."""
    with writing(out.store_dir / "deleted"):
        done, dropped = settle_staged(out)
    if done:
        say(f"the --delete of an interrupted run was published: its {done} staged tombstones committed")
    if dropped:
        say(f"the --delete of an interrupted run was not published: its {dropped} staged tombstones removed")
    return done, dropped


def _commit(staged: Path, path: Path) -> None:
    with writing(path):
        os.replace(staged, path)


def read_delete_ids(path: Path, id_column: str, read: ReadConfig | None = None,
                    stats: ReadStats | None = None) -> DeleteIds:
    """The ids of ``--delete FILE``: its ``id_column``, or its only column (integer or string values); how they
    are read (as integers or as exact text) is settled against the index's ids (``DeleteIds.typed``). A file that
    is missing, not a regular file (a directory, a FIFO) or unreadable is no input (66); one that opens but is not
    such a Parquet file (0 bytes too) is bad input (65); an OS read error is retried as a source's (``read``,
    counted in ``stats``), then 74; each names the flag and the file."""
    where = f"--delete {quote_path(path)}"
    if input_file_size("--delete", path) == 0:
        raise BadInputError(f"{where} is empty (0 bytes): not a Parquet file; to delete nothing, give a Parquet file "
                            "with no rows or leave the flag out")

    def load() -> tuple[list[str], str | None, pa.Array | None]:
        fault("read_footer", str(path))
        schema = pq.read_schema(path)
        names = schema.names
        name = id_column if id_column in names else names[0] if len(names) == 1 else None
        if name is not None:
            check_unique_columns(path, schema, [name])  # 65: two columns named like the id column
        if name is None:
            return names, None, None
        table = read_table(path, columns=[name], page_checksum_verification=True)  # every row (parquet_rows)
        return names, name, table.column(name).combine_chunks()

    try:
        names, column, values = read_retrying(path, load, read or ReadConfig(), stats, "not a readable Parquet file")
    except (BadInputError, NoInputError, PetalIOError) as exc:  # named by the file alone: say the flag too
        raise type(exc)(f"--delete {exc}") from exc
    if column is None or values is None:
        raise BadInputError(f"{where}: no column {id_column!r} (columns: {quote_names(names)}); give a Parquet file "
                            "with the id column, or a single column")
    if pa.types.is_dictionary(values.type):  # a categorical column: its values
        values = values.dictionary_decode()
    if str(values.type) == "string_view":  # as a shard's string_view ids: their text
        values = values.cast(pa.large_string())
    if pa.types.is_null(values.type):  # no values at all
        values = pa.array([None] * len(values), pa.string())
    if not (pa.types.is_integer(values.type) or pa.types.is_string(values.type)
            or pa.types.is_large_string(values.type)):
        raise BadInputError(f"--delete {quote_path(path)}: column {column!r} is {values.type}, not integer "
                            "or string ids")
    if not pa.types.is_integer(values.type):  # NOTE: pyarrow reads a string column's bytes unchecked
        bad = first_undecodable(read_ids(values))
        if bad is not None:
            raise BadInputError(f"{where}: column {column!r} row {bad} holds bytes that are not UTF-8; ids are text "
                                "(petal index skips such an id's row as a bad row, invalid_utf8_id: none is indexed)")
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


def deleted_as_text(entries: list[StoreEntry], asked: DeleteIds) -> bool:
    """How ``--delete``'s ids are read for the version of ``entries``: as its ids (``string_ids``). A version with
    no entries (``--sync`` over sources that hold none) has no id type: they are read as their column holds them
    (none is found in it; ``Deletion.gone_with_shards`` counts those the live version held)."""
    return string_ids(entries) if entries else not pa.types.is_integer(asked.values.type)


@dataclass
class Deletion:
    """What ``--delete`` did: ids asked for, deleted now, deleted by an earlier run already, not found."""

    requested: int = 0
    deleted: int = 0  # ids with rows this run removes
    already_deleted: int = 0  # ids found only in rows an earlier --delete removed: nothing to do for them
    not_found: int = 0
    rows: int = 0  # store rows newly tombstoned (an id in several shards counts in each)
    missing: pa.Array = field(default_factory=lambda: pa.array([], pa.string()))  # the ids not found, as text
    pending: list[tuple[StoreEntry, np.ndarray]] = field(default_factory=list)  # tombstones not written yet

    staged: list[tuple[Path, Path]] = field(default_factory=list)  # (staged file, the tombstone it replaces)

    def pending_counts(self) -> dict[Path, int]:
        """The deleted rows each entry will have once the pending tombstones are written (by entry path)."""
        return {entry.path: len(rows) for entry, rows in self.pending}

    def apply(self, entries: list[StoreEntry]) -> list[StoreEntry]:
        """``entries`` with the pending tombstones in memory (``PlannedEntry``): what the build leaves out and the
        manifest counts. Nothing is written: the tombstones are staged at the publish (``stage``)."""
        planned = {entry.path: rows for entry, rows in self.pending}
        return [PlannedEntry(e.path, e.meta, planned[e.path], checked=e.checked) if e.path in planned else e
                for e in entries]

    def stage(self, version: str) -> None:
        """Write the pending tombstones beside the store, each fsynced, to be published as ``version``: in force
        once ``CURRENT`` names it (``staged_in_force``), inert until then. A failure removes what was staged."""
        try:
            for entry, rows in self.pending:
                path = staged_path(entry.path, version)
                _write_rows(path, rows, version)
                self.staged.append((path, tombstone_path(entry.path)))
        except BaseException:
            self.discard()
            raise

    def commit(self) -> None:
        """After the publish: each staged tombstone becomes its entry's tombstone (one rename each)."""
        while self.staged:
            staged, path = self.staged[0]
            _commit(staged, path)
            fsync_dir(path.parent)
            self.staged.pop(0)

    def discard(self) -> None:
        """The run published nothing: remove its staged tombstones (best effort: the next run removes what is
        left, and a staged tombstone its version never published is never in force)."""
        for staged, _ in self.staged:
            with contextlib.suppress(OSError):
                staged.unlink(missing_ok=True)
        self.staged = []

    def with_carried(self, carried: Deletion) -> Deletion:
        """This deletion and ``carried``'s tombstones (``carry_deletions``) for the entries it plans none for (those
        it plans were planned from the carried rows: they hold them). Returns ``self``."""
        mine = {entry.path for entry, _ in self.pending}
        self.pending = [*(p for p in carried.pending if p[0].path not in mine), *self.pending]
        return self

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


def apply_deletes(entries: list[StoreEntry], asked: DeleteIds) -> Deletion:
    """Plan a tombstone for every row of ``entries`` whose id is in ``asked`` (rows deleted already stay); nothing
    is written: the tombstones wait in ``Deletion.pending`` (the build reads them through ``Deletion.apply``) and
    are staged and committed with the version that publishes them. The ids are read as the version's ids are
    (``DeleteIds.typed``, ``deleted_as_text``)."""
    as_text = deleted_as_text(entries, asked)
    ids = asked.typed(as_text)
    id_type = pa.string() if as_text else pa.int64()
    result = Deletion(requested=len(ids))
    found = np.zeros(len(ids), dtype=bool)
    fresh = np.zeros(len(ids), dtype=bool)  # ids with a row this run removes (not only rows deleted already)
    for entry in entries:
        rows = entry.rows()
        entry_ids = rows.column("id").cast(id_type)
        hit = pc.is_in(entry_ids, value_set=ids).to_numpy(zero_copy_only=False)
        if not hit.any():
            continue
        hit_ids = pc.filter(entry_ids, pa.array(hit))
        found |= pc.is_in(ids, value_set=pc.unique(hit_ids)).to_numpy(zero_copy_only=False)
        old = deleted_rows(entry)
        hit_rows = rows.column("row").to_numpy()[hit].astype(np.int64)
        now = ~np.isin(hit_rows, old)
        if now.any():
            fresh |= pc.is_in(ids, value_set=pc.unique(hit_ids.filter(pa.array(now)))).to_numpy(zero_copy_only=False)
            new = np.union1d(old, hit_rows)
            result.pending.append((entry, new))
            result.rows += len(new) - len(old)
    result.deleted = int(fresh.sum())
    result.already_deleted = int(found.sum()) - result.deleted
    result.not_found = len(ids) - int(found.sum())
    result.missing = ids.filter(pa.array(~found)).cast(pa.string())
    return result


def carry_deletions(store: EmbeddingStore, entries: list[StoreEntry], live: Manifest | None, live_exists: bool,
                    say: Callable[[str], None]) -> Deletion:
    """The deleted rows each of ``entries`` (the new version's) holds: a deletion holds for a shard while it stays in
    the live version with the same content, whatever its vectors are made with (``held_by_live``). Planned where they
    differ from the entry's tombstone, as ``--delete``'s are (``Deletion.pending``: staged and committed with the
    version that publishes them, nothing written here); the other counts stay 0 (nothing is deleted now):

    - a shard the live version held with the same content (sha256) under another entry (a ``--full`` run with another
      model, ``--max-length``, ``--dim``, ``--quantize``; a store format change) takes over that entry's deleted rows
      (a store row is the shard's row: the same for the same content);
    - an entry reused for a shard the live version did not hold at it (the content reverted to an earlier one, the
      shard added back after ``--sync`` dropped it) is planned with no deleted rows: its deletion ended with the
      content or the shard, and the entry's tombstone (kept with it for rollbacks) is replaced by an empty one;
      unless that tombstone was published after the live version (``CURRENT`` set back before the --delete: it holds).

    ``live``: the live manifest; when it cannot be read (``live_exists`` and ``live`` is None: ``--full`` over a
    damaged version) each entry keeps its tombstone and takes over those of the shard's other entries with the same
    content; with no live version at all, each keeps its own.

    A tombstone that cannot be read is 65 naming it; one that holds fewer rows than the live version counts is
    carried as it is, with a warning through ``say`` (the rows it lost come back, as in any run)."""
    held = {shard_key(s.abs_path): s for s in live.shards} if live is not None else {}
    result = Deletion()
    for entry in entries:
        own = held_rows(entry.path)
        if live is not None:
            rows = held_by_live(entry, own, held.get(entry.path.parent.name), say, live.version)
        elif live_exists:
            rows = own
            for fingerprint in _same_content_tombstones(store, entry):
                rows = np.union1d(rows, held_rows(entry.path.parent / fingerprint))
        else:
            rows = own
        if not np.array_equal(rows, own):
            result.pending.append((entry, rows.astype(np.int64)))
    return result


def held_by_live(entry: StoreEntry, own: np.ndarray, record: ShardRecord | None,
                 say: Callable[[str], None], live_version: str | None = None) -> np.ndarray:
    """The deleted rows ``entry`` holds in a version built over the live one, whose shard ``record`` it is (``None``:
    the live version lacks the shard): ``own`` (the entry's tombstone) where the live version holds the shard at this
    entry, the rows of the entry it holds it at where the content is the same, else none. NOTE: the entry's own
    tombstone held wherever the entry was reused, so a shard back to an earlier content, or added back, lost again the
    documents a --delete had removed from it before the deletion ended (the old entry is kept for rollbacks).

    Where the live version lacks the shard at this content, ``own`` still holds when its tombstone was published
    after the live version (``live_version``): ``CURRENT`` was set back to before that --delete, which holds for
    every later run (README); or when it carries no version (written before tombstones were stamped).
    NOTE: without this, a rollback to before the shard was added or edited brought a later --delete's documents back
    without a word, and the run's empty tombstone ended that deletion for good."""
    if record is not None and record.entry == entry.fingerprint:
        rows = own
    elif record is not None and record.sha256 == entry.source_sha256 and record.deleted:
        rows = held_rows(entry.path.parent / record.entry)
    else:
        if len(own):
            stamp = published_by(entry.path)
            if stamp is None or live_version is None or stamp > live_version:
                return own
        return np.zeros(0, dtype=np.int64)
    if not len(rows) and record.deleted and tombstone_path(entry.path.parent / record.entry).is_file():
        say(f"warning: {quote_path(record.path)}: a run after the live version ended its --delete of "
            f"{record.deleted} rows (the shard's content changed or it left the index): those documents are indexed "
            "again; pass --delete IDS to delete them again")
    elif len(rows) < record.deleted:  # NOTE: a lost tombstone; said, not silent (also the entry's own)
        say(f"warning: {quote_path(tombstone_path(entry.path.parent / record.entry))} holds {len(rows)} deleted rows "
            f"of {quote_path(record.path)}, the live version {record.deleted}: the rows it lost are indexed again")
    return rows


INDEX_WAY_OUT = "remove it to index those rows again"  # what petal index does once it is gone (carry_deletions)


def held_rows(entry_dir: Path, way_out: str = INDEX_WAY_OUT) -> np.ndarray:
    """The deleted rows of the (older) entry in ``entry_dir``: an OS error is 74 (66 denied), a file that is
    no tombstone 65, each naming it and, after "restore it, or", ``way_out``: the other way out for the command
    reading it (``petal index`` indexes the rows again once it is removed; ``petal rebuild`` refuses that: its own)."""
    path = tombstone_path(entry_dir)
    try:
        return deleted_rows(StoreEntry(entry_dir, {}))
    except OSError as exc:
        raise io_error(exc) from exc
    except (pa.ArrowException, KeyError) as exc:
        raise BadInputError(f"{quote_path(path)} (a --delete tombstone) cannot be read ({one_line(str(exc))}): the "
                            f"rows it deleted cannot be left out of the new version; restore it, or {way_out}") from exc


def _same_content_tombstones(store: EmbeddingStore, entry: StoreEntry) -> list[str]:
    """Fingerprints of the shard's other committed entries with a tombstone and ``entry``'s content."""
    key_dir = tombstone_path(entry.path).parent
    if not key_dir.is_dir():
        return []
    found = []
    for path in sorted(key_dir.glob("*.parquet")):
        fingerprint = path.name[:-len(".parquet")]
        if STAGED in path.name or fingerprint == entry.fingerprint or fingerprint.startswith("."):
            continue
        try:
            other = store.read_entry(entry.path.parent / fingerprint)
        except (FileNotFoundError, DamagedEntry):
            continue  # NOTE: no entry to say its content: a tombstone left by a pruned entry is no evidence
        if other.source_sha256 == entry.source_sha256:
            found.append(fingerprint)
    return found


def published_by(entry_dir: Path) -> str | None:
    """The version whose publish wrote the tombstone of the entry in ``entry_dir`` (its ``petal.version``); ``None``
    for none there, one written before petal stamped them, or one that cannot be read (``held_rows`` says so)."""
    try:
        metadata = pq.read_schema(tombstone_path(entry_dir)).metadata or {}
    except (OSError, pa.ArrowException):
        return None
    stamp = metadata.get(VERSION_KEY)
    return stamp.decode("utf-8", "replace") if stamp else None


def _write_rows(path: Path, rows: np.ndarray, version: str) -> None:
    """``path`` (a tombstone's rows, stamped with the ``version`` that publishes them), written whole and fsynced, or
    not at all (its directories too)."""
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    with writing(path):
        for directory in (path.parent.parent, path.parent):  # store/deleted/, its <shard key>/
            if not directory.is_dir():
                directory.mkdir(exist_ok=True)
                fsync_dir(directory.parent)
        table = pa.table({"row": pa.array(rows, pa.int64())}).replace_schema_metadata({VERSION_KEY: version})
        pq.write_table(table, tmp, write_page_checksum=True)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
