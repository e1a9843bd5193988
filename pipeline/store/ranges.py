"""Row-group ranges of large shards: the units of work of a scaled-out embed phase, each committed on its own.

```
OUT/store/parts/<shard key>/<fingerprint>/g<first>-<stop>/   a committed range: row groups [first, stop) of
                                                             the shard, the files of a store entry
                                                             (embeddings.npy holds the range's rows only)
```

A shard of more than ``split_rows`` rows with several row groups is cut at row-group boundaries into
ranges of about ``split_rows`` rows; any worker may embed any range. Each range commits as a part
(one rename, like a shard's entry), keyed by the shard's fingerprint, so a shard that changed has
none. When the last range of a shard commits, the coordinator assembles the parts into the shard's
ordinary store entry (store/embeddings.py: the same files and ``entry.json`` a single process
writes) and drops the parts: every later step (the index build, tombstones, stored columns, the
manifest, incremental runs) sees only shard entries, and stores written before ranges existed read
as they always did. A killed worker loses only its uncommitted range; the rerun embeds the ranges
the shard still lacks (the gaps between its committed parts) and assembles.

Ids repeated within a shard are rejected (``duplicate_id``, the first row wins) within a range by the
reader and across ranges here, at assembly, so the entry equals a single process's.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow.parquet as pq

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.parquet import ReadStats, ShardInfo, read_retrying
from petal.pipeline.ingest.remote import RemotePath
from petal.pipeline.reliability.errors import writing
from petal.pipeline.reliability.faults import fault
from petal.pipeline.store.embeddings import (
    DamagedEntry,
    EmbeddingStore,
    StoreEntry,
    commit_entry,
    same_spelling,
    shard_key,
    store_listing,
)

PART_NAME = re.compile(r"^g(\d{6,})-(\d{6,})$")


@dataclass(frozen=True)
class RowRange:
    """One unit of work: row groups ``[first_group, stop_group)`` (rows ``[first_row, first_row + num_rows)``) of
    the shard at ``position`` (in the run's list of shards to embed); ``whole``: the entire shard, committed as
    its entry at once (no parts)."""

    position: int
    first_group: int
    stop_group: int
    first_row: int
    num_rows: int
    whole: bool = False

    @property
    def stop_row(self) -> int:
        return self.first_row + self.num_rows

    @property
    def name(self) -> str:
        return f"g{self.first_group:06d}-{self.stop_group:06d}"

    def record(self) -> dict[str, int]:
        return {"first_group": self.first_group, "stop_group": self.stop_group, "first_row": self.first_row,
                "num_rows": self.num_rows}


def parts_root(store: EmbeddingStore, info: ShardInfo, fingerprint: str) -> Path:
    return store.root / "parts" / shard_key(info) / fingerprint


def part_dir(store: EmbeddingStore, info: ShardInfo, fingerprint: str, part: RowRange) -> Path:
    return parts_root(store, info, fingerprint) / part.name


def group_rows(info: ShardInfo, read: ReadConfig | None = None, stats: ReadStats | None = None) -> list[int]:
    """The rows of each row group of the shard: what preflight read from its footer (``ShardInfo.group_rows``),
    else the footer read again through the sources' reader (a ranged read for an object, closed after; an OS read
    error retried, counted in ``stats``, then 74; permission denied 66; a footer that does not decode 65)."""
    if len(info.group_rows) == info.num_row_groups:
        return list(info.group_rows)
    read = read or ReadConfig()

    def footer() -> list[int]:
        fault("read_footer", str(info.path))
        with contextlib.closing(cast(Any, info.path.open())) if isinstance(info.path, RemotePath) \
                else contextlib.nullcontext(info.path) as source:
            meta = pq.read_metadata(source)
        return [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]

    return read_retrying(info.path, footer, read, stats, "not a readable Parquet file")


def committed_parts(store: EmbeddingStore, info: ShardInfo, fingerprint: str) -> dict[tuple[int, int], StoreEntry]:
    """The shard's committed ranges by ``(first_group, stop_group)``; a damaged one is moved out of sight, one petal
    may not read (or a directory of them) is 66 naming it, kept (``store_listing``: not damage)."""
    root = parts_root(store, info, fingerprint)
    found: dict[tuple[int, int], StoreEntry] = {}
    for path in store_listing(root, store.root):
        match = PART_NAME.match(path.name)
        if match is None:
            continue
        try:
            found[(int(match[1]), int(match[2]))] = store.read_entry(path, verify=True)
        except FileNotFoundError:
            continue
        except DamagedEntry as exc:
            store.repaired(exc, info, "the range")
    return found


@dataclass(frozen=True)
class RangePlan:
    """The units of an embed phase, and the committed ranges (of earlier runs) they complete."""

    ranges: list[RowRange]
    reused: dict[int, list[tuple[RowRange, StoreEntry]]]  # position -> committed ranges of that shard

    @property
    def split(self) -> bool:
        return any(not r.whole for r in self.ranges) or bool(self.reused)


def whole_shards(shards: list[ShardInfo]) -> RangePlan:
    """Every shard as one unit, nothing reused."""
    units = [RowRange(p, 0, info.num_row_groups, 0, info.num_rows, whole=True) for p, info in enumerate(shards)]
    return RangePlan(units, {})


def plan_ranges(store: EmbeddingStore, shards: list[ShardInfo], fingerprints: list[str],
                split_rows: int, read: ReadConfig | None = None, stats: ReadStats | None = None,
                full: bool = False) -> RangePlan:
    """Cut each shard into units: the whole shard, or (more than ``split_rows`` rows in several row groups, or
    ranges committed already) the row-group ranges it still lacks, of about ``split_rows`` rows each
    (``split_rows`` 0: never cut a shard; the gaps of one with committed ranges are one unit each).
    ``full`` (``--full``: every row is embedded again): committed ranges are ignored (a new commit of the same range
    replaces one; the rest go when the shard is assembled, or with the next prune), but for those the stopped
    ``--full`` run it resumes committed (``EmbeddingStore.own_commit``)."""
    ranges: list[RowRange] = []
    reused: dict[int, list[tuple[RowRange, StoreEntry]]] = {}
    for position, (info, fingerprint) in enumerate(zip(shards, fingerprints)):
        parts = committed_parts(store, info, fingerprint) if not full or store.full_run_resumed else {}
        if full:
            parts = {key: entry for key, entry in parts.items() if store.own_commit(entry) is not None}
        # NOTE: a range committed by a run that named the shard another way holds ids of that spelling: embedded again
        parts = {key: entry for key, entry in parts.items() if same_spelling(entry, info)}
        big = 0 < split_rows < info.num_rows and info.num_row_groups > 1
        if not parts and not big:
            ranges.append(RowRange(position, 0, info.num_row_groups, 0, info.num_rows, whole=True))
            continue
        counts = group_rows(info, read, stats)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(int).tolist()
        have: list[tuple[RowRange, StoreEntry]] = []
        covered = 0  # committed ranges that tile the shard from the left without overlap are kept
        for (first, stop), entry in sorted(parts.items()):
            if first < covered or stop > len(counts) or first >= stop:
                continue  # overlapping or out of bounds (another split, a file that changed): embedded again
            have.append((RowRange(position, first, stop, starts[first], starts[stop] - starts[first]), entry))
            covered = stop
        if have:
            reused[position] = have
        taken = {g for r, _ in have for g in range(r.first_group, r.stop_group)}
        group = 0
        while group < len(counts):
            if group in taken:
                group += 1
                continue
            first, rows = group, 0
            while group < len(counts) and group not in taken and (split_rows <= 0 or rows < split_rows):
                rows += counts[group]
                group += 1
            ranges.append(RowRange(position, first, group, starts[first], starts[group] - starts[first]))
    return RangePlan(ranges, reused)


class RangeAssembly:
    """Turns unit commits into shard entries: a whole shard's entry as it commits, a split shard's once its
    last range commits (assembled from its parts)."""

    def __init__(self, store: EmbeddingStore, shards: list[ShardInfo], fingerprints: list[str],
                 settings: dict[str, Any], dim: int, plan: RangePlan) -> None:
        self.store = store
        self.shards = shards
        self.fingerprints = fingerprints
        self.settings = settings
        self.dim = dim
        self.plan = plan
        self.left = Counter(r.position for r in plan.ranges)
        self.parts: dict[int, list[tuple[RowRange, StoreEntry]]] = {p: list(v) for p, v in plan.reused.items()}
        self.embedded: list[RowRange] = []  # ranges (parts) committed by this run

    def ready(self) -> list[tuple[int, StoreEntry]]:
        """Shards whose every range was committed by an earlier run (it stopped before assembling them)."""
        return [(p, self._assemble(p)) for p in list(self.parts) if self.left[p] == 0]

    def commit(self, unit: int, entry: StoreEntry) -> list[tuple[int, StoreEntry]]:
        """Unit ``unit`` committed ``entry``; returns the shard entries complete now (``(position, entry)``)."""
        part = self.plan.ranges[unit]
        if part.whole:
            return [(part.position, entry)]
        self.embedded.append(part)
        self.parts.setdefault(part.position, []).append((part, entry))
        self.left[part.position] -= 1
        return [(part.position, self._assemble(part.position))] if self.left[part.position] == 0 else []

    def report(self, split_rows: int) -> dict[str, Any]:
        """The run report's ``ranges``: the target, and which ranges this run embedded and which it reused."""
        def named(ranges: Iterator[RowRange] | list[RowRange]) -> list[dict[str, Any]]:
            ordered = sorted(ranges, key=lambda r: (r.position, r.first_row))
            return [{"shard": str(self.shards[r.position].path), "row_groups": [r.first_group, r.stop_group],
                     "rows": [r.first_row, r.stop_row]} for r in ordered]

        return {"split_rows": split_rows,
                "shards_split": len({r.position for r in self.plan.ranges if not r.whole} | set(self.plan.reused)),
                "embedded": named(self.embedded),
                "reused": named(r for parts in self.plan.reused.values() for r, _ in parts),
                # rows of reused ranges (the run's rows.embedded counts a shard assembled now as embedded now)
                "rows_reused": sum(e.num_embedded for parts in self.plan.reused.values() for _, e in parts)}

    def _assemble(self, position: int) -> StoreEntry:
        parts = sorted(self.parts.pop(position), key=lambda p: p[0].first_row)
        info, fingerprint = self.shards[position], self.fingerprints[position]
        tmp = self.store.tmp_dir / f"{shard_key(info)}-assemble-{uuid.uuid4().hex[:8]}"
        final = self.store.shards_dir / shard_key(info) / fingerprint
        try:
            with writing(tmp):
                tmp.mkdir(parents=True)
                entry = _assemble(self.store, tmp, final, info, self.settings, self.dim, parts)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        root = parts_root(self.store, info, fingerprint)
        if root.is_dir():  # NOTE: after the entry is visible: a crash here leaves parts the next prune removes
            self.store.discard(root)
        return entry


def _assemble(store: EmbeddingStore, tmp: Path, final: Path, info: ShardInfo, settings: dict[str, Any], dim: int,
              parts: list[tuple[RowRange, StoreEntry]]) -> StoreEntry:
    """The shard's entry from its ``parts`` (by first row). A row whose id an earlier range took (embedded, or
    rejected after the read checks took it: as in one process, whose reader takes an id before the tokenizer and the
    engine see the row) is a ``duplicate_id``: its vector zeroed, and out of every count its part gave it (embedded,
    tokens, truncated, its part's reason). NOTE: a part of an older petal, without the per-row columns, keeps its
    counts whole (tokens, truncated) and its rejects' reasons."""
    vectors = np.lib.format.open_memmap(tmp / "embeddings.npy", mode="w+", dtype=np.float32, shape=(info.num_rows, dim))
    seen: set = set()
    rows: list[np.ndarray] = []
    ids: list = []
    rejects: list[tuple[int, str]] = []
    truncated = tokens = 0
    for part, entry in parts:
        vectors[part.first_row : part.stop_row] = entry.embeddings()
        table, dropped = entry.rows(), entry.rejects()
        part_rows = table.column("row").to_numpy()
        part_ids = table.column("id").to_pylist()
        taken = dropped.column("id").to_pylist() if "id" in dropped.column_names else [None] * dropped.num_rows
        repeated = np.array([doc_id in seen for doc_id in part_ids], dtype=bool)  # a later range repeats an id
        again = np.array([doc_id is not None and doc_id in seen for doc_id in taken], dtype=bool)
        tokens += entry.num_tokens - _flagged(table, "tokens", repeated)
        truncated += entry.num_truncated - _flagged(table, "truncated", repeated) \
            - _flagged(dropped, "truncated", again)
        seen.update(doc_id for doc_id, r in zip(part_ids, repeated) if not r)
        seen.update(doc_id for doc_id in taken if doc_id is not None)
        if repeated.any():
            vectors[part_rows[repeated]] = 0.0
            rejects.extend((int(row), "duplicate_id") for row in part_rows[repeated])
            part_rows = part_rows[~repeated]
            part_ids = [doc_id for doc_id, r in zip(part_ids, repeated) if not r]
        rows.append(part_rows)
        ids.extend(part_ids)
        rejects.extend((row, "duplicate_id" if a else reason) for row, reason, a in
                       zip(dropped.column("row").to_pylist(), dropped.column("reason").to_pylist(), again.tolist()))
    vectors.flush()
    del vectors
    all_rows = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    return commit_entry(store, tmp, final, info, settings, dim, all_rows, ids, sorted(rejects), info.num_rows,
                        truncated, {}, tokens)


def _flagged(table: Any, column: str, rows: np.ndarray) -> int:
    """The sum of ``column`` (a part's per-row tokens or truncated flags) over ``rows`` (a mask); 0 in a part of an
    older petal, which has no such column."""
    if column not in table.column_names or not rows.any():
        return 0
    return int(table.column(column).to_numpy(zero_copy_only=False)[rows].sum())
