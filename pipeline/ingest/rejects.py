"""Bad rows: the rejects file (every skipped row: shard, row, reason) and the bad-row gate.

A published version carries ``rejects.parquet`` for the rows it skipped. A run refused for its bad
rows (``--strict``, or more than ``--max-bad-rows``) stops as soon as it is over the limit and
writes the bad rows found so far to ``OUT/rejects.parquet``, named in the error and the report.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.jobs.report import RunReport
from petal.pipeline.reliability.errors import BadInputError, writing
from petal.pipeline.store.embeddings import StoreEntry

REJECTS_SCHEMA = pa.schema([("shard", pa.string()), ("row", pa.int64()), ("reason", pa.string())])


def rejects_table(entries: list[StoreEntry], pending: list[tuple[str, int, str]] | None = None,
                  shard_paths: dict[str, str] | None = None) -> pa.Table:
    """The rejects of committed ``entries`` plus ``pending`` ``(shard, row, reason)`` rows, by shard and row; a
    shard named by ``shard_paths`` (abs path -> the path this run's version records), else by its entry's path."""
    paths = shard_paths or {}
    tables = []
    for entry in entries:
        rejects = entry.rejects()
        if rejects.num_rows:
            source = entry.meta["source"]
            shard = pa.array([paths.get(source["abs_path"], source["path"])] * rejects.num_rows, pa.string())
            tables.append(pa.table({"shard": shard, "row": rejects.column("row"), "reason": rejects.column("reason")},
                                   schema=REJECTS_SCHEMA))
    if pending:
        rows = sorted(pending)
        tables.append(pa.table({"shard": [r[0] for r in rows], "row": [r[1] for r in rows],
                                "reason": [r[2] for r in rows]}, schema=REJECTS_SCHEMA))
    return pa.concat_tables(tables) if tables else REJECTS_SCHEMA.empty_table()


def write_rejects(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` atomically (exit 74 naming it on an I/O error)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with writing(path):
        pq.write_table(table, tmp, write_page_checksum=True)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)


class BadRowGate:
    """Counts skipped rows as the run finds them; over ``limit`` it raises ``BadInputError`` (65).

    ``limit`` is 0 for ``--strict`` and the ``--max-bad-rows`` budget otherwise. Rows skipped in
    shards not yet committed are held here (their shard's writer drops them on abort); once a shard
    commits, its store entry holds them, non-finite embeddings included.
    """

    def __init__(self, limit: int, flag: str, report: RunReport, out_file: Path) -> None:
        self.limit = limit
        self.flag = flag  # "--strict" or "--max-bad-rows 0.01"
        self.report = report
        self.num_rows = int(report.rows["total"])
        self.out_file = out_file
        self.committed: list[StoreEntry] = []
        self.num_committed = 0  # bad rows in ``committed``
        self.pending: dict[int, list[tuple[str, int, str]]] = {}  # by shard position in this run
        self.num_pending = 0
        self.shard_paths: dict[str, str] = {}  # abs path -> the path this run names the shard by (rejects_table)

    @property
    def total(self) -> int:
        return self.num_committed + self.num_pending

    def reuse(self, entry: StoreEntry) -> None:
        """A shard committed by an earlier run."""
        self.committed.append(entry)
        self.num_committed += sum(int(n) for n in entry.meta["counts"]["skipped"].values())
        self.check()

    def commit(self, shard_index: int, entry: StoreEntry) -> None:
        """Shard ``shard_index`` of this run committed: its bad rows now live in ``entry``."""
        self.num_pending -= len(self.pending.pop(shard_index, []))
        self.reuse(entry)

    def add(self, shard_index: int, shard: str, rejects: list[tuple[int, str]]) -> None:
        if rejects:
            self.pending.setdefault(shard_index, []).extend((shard, row, why) for row, why in rejects)
            self.num_pending += len(rejects)
            self.check()

    def check(self) -> None:
        total = self.total
        if total <= self.limit:
            return
        table = rejects_table(self.committed, [r for rows in self.pending.values() for r in rows], self.shard_paths)
        write_rejects(table, self.out_file)
        self.report.rejects_file = str(self.out_file)
        counts = Counter(table.column("reason").to_pylist())
        self.report.rows["skipped"] = dict(sorted(counts.items()))  # the refused run's report counts what it found
        reasons = ", ".join(f"{why} {n}" for why, n in sorted(counts.items()))
        first = table.slice(0, 1).to_pylist()[0]
        limit = "" if self.flag == "--strict" else f" (over {self.limit} of {self.num_rows} rows)"
        raise BadInputError(f"{total} bad rows with {self.flag}{limit}: {reasons}; first: {first['shard']} row "
                            f"{first['row']} ({first['reason']}); all found are listed in {self.out_file}")
