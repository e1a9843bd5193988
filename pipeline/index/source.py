"""The vectors an index is built from: the committed store entries of the current shards.

A document id seen in several shards keeps the vector of the last shard in sorted order (one
Arrow ``group_by``). FAISS ids are ``0..total-1`` in entry order, then row order; ``ids.parquet``
maps them back to documents. Vectors are read from the entries' memory-mapped ``.npy`` files one
bounded chunk at a time, never all at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.index.files import IDS_GROUP_ROWS
from petal.pipeline.store.embeddings import StoreEntry, VectorReader, check_row_files
from petal.pipeline.store.tombstones import deleted_rows

TAKE_BLOCK_ROWS = 1024  # vectors ``take`` copies at a time (4 MiB at 1024 dims)


class StoreVectors:
    """The de-duplicated vectors of ``entries`` (in shard order), addressed by FAISS id."""

    def __init__(self, entries: list[StoreEntry], dim: int, shard_paths: dict[str, str] | None = None) -> None:
        self.entries = entries
        self.dim = dim
        self.shard_paths = shard_paths or {}  # abs path -> the path the version's manifest records (write_ids)
        self.id_type = pa.string() if any(e.meta.get("id_type") == "string" for e in entries) else pa.int64()
        for entry in entries:
            check_row_files(entry)  # an unchecked entry's (a kept shard's) rows: 65 when changed since the commit
        # NOTE: de-duplication needs every id at once (transient, O(num documents)); what stays is
        # one int32 position per indexed vector. Arrow's allocator keeps freed pages until released.
        ids = [pq.read_table(e.path / "rows.parquet", columns=["id"]).column("id").cast(self.id_type)
               for e in entries]
        sizes = [len(column) for column in ids]
        all_ids = pa.chunked_array([c for column in ids for c in column.chunks], self.id_type)
        alive = deleted_mask(entries, sizes)  # rows removed by --delete take no part in de-duplication
        seq = pa.array(np.arange(len(all_ids), dtype=np.int64))
        # NOTE: one thread: Arrow's threaded hash aggregation keeps per-thread state that grows with the
        # core count (RssAnon +133 MB at 16 threads against +47 MB single-threaded, 300k ids) and was slower
        # here (5M ids: 6.4 vs 2.2 s)
        live = pa.table({"id": all_ids, "seq": seq}).filter(pa.array(alive))
        last = live.group_by("id", use_threads=False).aggregate([("seq", "max")])
        kept = np.zeros(len(all_ids), dtype=bool)
        kept[last.column("seq_max").to_numpy()] = True
        self.deleted = int(len(alive) - alive.sum())  # rows left out because --delete named their ids
        del ids, all_ids, seq, live, last
        pa.default_memory_pool().release_unused()
        self._keep: list[np.ndarray] = []  # per entry: positions into entry.rows() that are indexed
        offset = 0
        for size in sizes:
            self._keep.append(np.flatnonzero(kept[offset : offset + size]).astype(np.int32))
            offset += size
        self.starts = np.cumsum([0] + [len(k) for k in self._keep])  # [num_entries + 1] first FAISS id per entry
        self.total = int(self.starts[-1])
        self.superseded = len(kept) - self.deleted - self.total  # vectors dropped: a later shard has the same id
        self._checked: set[int] = set()  # unchecked entries whose every byte ``chunks`` has read and checked

    def _rows(self, i: int) -> np.ndarray:
        """Store rows (ascending) of entry ``i``'s indexed vectors."""
        rows = pq.read_table(self.entries[i].path / "rows.parquet", columns=["row"]).column("row")
        return rows.to_numpy()[self._keep[i]]

    def chunks(self, max_rows: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(faiss_ids [n] int64, vectors [n, dim] float32)``, n <= ``max_rows``, in FAISS id order. An entry this
        process has not checked whole (a kept shard's) is read through ``VectorReader`` the first time: its bytes
        hashed as they are read, a damaged one 65 once read (every pass of a build reads every entry: the add)."""
        for i, (entry, start) in enumerate(zip(self.entries, self.starts)):
            if len(self._keep[i]) == 0:
                continue
            rows = self._rows(i)
            if not entry.checked and i not in self._checked:
                reader = VectorReader(entry)
                try:
                    for lo in range(0, len(rows), max_rows):
                        hi = min(lo + max_rows, len(rows))
                        yield np.arange(start + lo, start + hi, dtype=np.int64), reader.take(rows[lo:hi])
                    reader.finish()
                finally:
                    reader.close()
                self._checked.add(i)
                continue
            vectors = entry.embeddings()
            for lo in range(0, len(rows), max_rows):
                hi = min(lo + max_rows, len(rows))
                ids = np.arange(start + lo, start + hi, dtype=np.int64)
                yield ids, np.ascontiguousarray(vectors[rows[lo:hi]], dtype=np.float32)
            # NOTE: dropping the memmap unmaps the entry, so its pages leave this process's RSS.
            del vectors

    def take(self, faiss_ids: np.ndarray) -> np.ndarray:
        """``[len(faiss_ids), dim]`` float32 for sorted, unique ``faiss_ids``."""
        assert np.all(np.diff(faiss_ids) > 0), "faiss_ids must be sorted and unique"
        out = np.empty((len(faiss_ids), self.dim), dtype=np.float32)
        bounds = np.searchsorted(faiss_ids, self.starts)
        for i, entry in enumerate(self.entries):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            if hi > lo:
                vectors, rows = entry.embeddings(), self._rows(i)[faiss_ids[lo:hi] - self.starts[i]]
                # NOTE: a block at a time straight into ``out``: one fancy index of the whole selection was a second
                # copy of it (the training sample twice in memory)
                for start in range(0, len(rows), TAKE_BLOCK_ROWS):
                    block = rows[start : start + TAKE_BLOCK_ROWS]
                    out[lo + start : lo + start + len(block)] = vectors[block]
                del vectors
        return out

    def sample(self, size: int, seed: int) -> np.ndarray:
        """``[min(size, total), dim]``: a seeded sample of the vectors (training, calibration)."""
        picks = np.random.default_rng(seed).choice(self.total, size=min(size, self.total), replace=False)
        return self.take(np.sort(picks))

    def write_ids(self, path: Path) -> None:
        """``ids.parquet``: faiss_id int64, id, shard (as given: the path the version's manifest records, else the
        one the entry was committed with), row int64, in FAISS id order."""
        schema = pa.schema([("faiss_id", pa.int64()), ("id", self.id_type), ("shard", pa.string()),
                            ("row", pa.int64())])
        with pq.ParquetWriter(path, schema, write_page_checksum=True) as writer:
            for entry, keep, start in zip(self.entries, self._keep, self.starts):
                if len(keep) == 0:
                    continue
                part = entry.rows().take(pa.array(keep))
                n = part.num_rows
                writer.write_table(pa.table({
                    "faiss_id": pa.array(np.arange(start, start + n, dtype=np.int64)),
                    "id": part.column("id").cast(self.id_type),
                    # NOTE: not the entry's own path alone: a shard first indexed as src/a.parquet (or through a
                    # link since removed) kept it in every later version, beside the path the manifest records
                    "shard": pa.array([self.shard_paths.get(entry.meta["source"]["abs_path"],
                                                            entry.meta["source"]["path"])] * n, pa.string()),
                    "row": part.column("row"),
                }, schema=schema), row_group_size=IDS_GROUP_ROWS)
            if self.total == 0:
                writer.write_table(schema.empty_table())


def deleted_mask(entries: list[StoreEntry], sizes: list[int]) -> np.ndarray:
    """``[sum(sizes)]`` bool over the entries' stored rows in order: False where ``--delete`` removed the row."""
    alive = np.ones(sum(sizes), dtype=bool)
    offset = 0
    for entry, size in zip(entries, sizes):
        dead = deleted_rows(entry)
        if len(dead):
            rows = pq.read_table(entry.path / "rows.parquet", columns=["row"]).column("row").to_numpy()
            alive[offset : offset + size] = ~np.isin(rows, dead)
        offset += size
    return alive


def split_sample(total: int, num_queries: int, num_train: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded FAISS-id samples: ``(queries, training)``, each sorted.

    Queries are drawn first; training takes up to ``num_train`` of the rest, so tuning runs on
    vectors the quantizer never saw when there are enough vectors. When the rest is fewer than
    ``num_train``, training takes queries too, up to ``num_train`` in all. NOTE: it took the rest alone:
    1,227 vectors under ``IVF16,PQ8`` left 227 after 1,000 queries, and FAISS refused to train 256
    PQ centroids on them (exit 78), where the corpus had enough.
    """
    rng = np.random.default_rng(seed)
    num_queries = min(num_queries, total)
    wanted = min(num_train, total)
    num_train = min(num_train, total - num_queries) if total > num_queries else min(num_train, total)
    if total > num_queries:
        picks = rng.choice(total, size=num_queries + num_train, replace=False)
        queries, training = picks[:num_queries], picks[num_queries:]
        if wanted > len(training):  # the queries are a random order: their first ones are a random sample
            training = np.concatenate([training, queries[: wanted - len(training)]])
        return np.sort(queries), np.sort(training)
    everything = np.arange(total, dtype=np.int64)
    return everything, np.sort(rng.choice(total, size=num_train, replace=False))
