"""The run report: every count a scheduler or a person needs, as JSON and as one summary line."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from petal.pipeline.reliability.errors import one_line


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class RunReport:
    """What a ``petal index`` or ``petal rebuild`` run did, as ``--json`` prints it (``as_dict``): ``status``
    (success, nothing-to-do, failed, interrupted) and ``exit_code``, the ``version`` published, counts of shards,
    rows (embedded, skipped by reason, truncated) and tokens, the model, engine and index settings, and timings."""

    command: str = "index"
    status: str = "running"  # success | nothing-to-do | failed | interrupted
    exit_code: int | None = None
    message: str = ""
    started_at: str = field(default_factory=_now)
    finished_at: str | None = None
    seconds: float = 0.0
    out: str = ""
    version: str | None = None
    shards: dict[str, int] = field(default_factory=lambda: {"total": 0, "embedded": 0, "reused": 0})
    shard_changes: dict[str, list[str]] = field(default_factory=dict)  # added/changed/removed/unchanged paths
    # --keep-columns against the live version's: before, after, added, dropped (empty: the same, or no live version)
    kept_column_changes: dict[str, list[str]] = field(default_factory=dict)
    rows: dict[str, Any] = field(default_factory=lambda: {"total": 0, "embedded": 0, "skipped": {}, "truncated": 0})
    tokens: int = 0
    model: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    index: dict[str, Any] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    rejects_file: str | None = None  # every skipped row: shard, row, reason
    # recovered from without failing: OS read errors retried, device-OOM batches split in two
    retries: dict[str, int] = field(default_factory=lambda: {"read": 0, "oom_splits": 0})
    # left: what the clean-up could not remove (path, reason), said on stderr and tried again by the next run
    pruned: dict[str, Any] = field(default_factory=lambda: {"versions": [], "store_entries": 0, "left": []})
    workers: list[dict[str, Any]] = field(default_factory=list)  # --devices/--workers/--ray: one summary each
    # row-group ranges of large shards (store/ranges.py): the target, ranges embedded and reused; only when any
    ranges: dict[str, Any] = field(default_factory=dict)
    removed: dict[str, Any] = field(default_factory=dict)  # documents of the live version not in the new one
    deletes: dict[str, Any] = field(default_factory=dict)  # --delete: requested, deleted, not_found
    repaired: str | None = None  # why the live version was rebuilt from the store (its files were damaged)
    # store entries (or committed ranges) found damaged and embedded again from their shard: entry, shard, reason
    damaged_entries: list[dict[str, str]] = field(default_factory=list)
    _t0: float = field(default_factory=time.perf_counter, repr=False)

    def skip(self, reason: str, count: int = 1) -> None:
        """Count ``count`` rows skipped for ``reason`` (``rows["skipped"]``)."""
        skipped = self.rows["skipped"]
        skipped[reason] = skipped.get(reason, 0) + count

    def finish(self, status: str, exit_code: int, message: str = "") -> None:
        """End the run: its status, exit code and message, the time it finished and its seconds."""
        self.status, self.exit_code, self.message = status, exit_code, message
        self.finished_at = _now()
        self.seconds = round(time.perf_counter() - self._t0, 3)

    def took_effect(self) -> bool:
        """Whether what the run planned happened: it ended as planned, or it stopped or failed once its version was
        live (``version`` is set at the publish). A run refused, failed or stopped before that changed nothing."""
        return self.status in ("success", "nothing-to-do") or bool(self.version)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``--json``, ``json_report``), with the embed phase's throughput. A run
        that published nothing deleted nothing: its ``--delete`` counts say ``planned``, and ``deleted`` and ``rows``
        0."""
        data = asdict(self)
        data.pop("_t0", None)
        if "deleted" in self.rows and not self.took_effect():
            data["rows"]["deleted"] = 0
            if self.deletes:
                data["deletes"]["planned"] = self.deletes.get("deleted", 0)
                data["deletes"]["deleted"] = data["deletes"]["rows"] = 0  # NOTE: rows: the rows they held, none gone
        if not self.ranges:  # NOTE: the key only when a shard was cut into ranges (the report's shape is a contract)
            data.pop("ranges", None)
        embed_s = self.timings_s.get("embed", 0.0)
        data["throughput"] = {
            "tokens_per_s": round(self.tokens / embed_s, 1) if embed_s > 0 else None,
            "rows_per_s": round(self.rows["embedded"] / embed_s, 1) if embed_s > 0 else None,
        }
        return data

    def write(self, path: Path) -> None:
        """``path``: a file (replaced atomically), ``-`` (stdout), or a FIFO/device (written in place)."""
        from petal.pipeline.jobs.report_file import write_report_to

        write_report_to(path, self.as_dict(), self.out or None)

    def _kept_columns_part(self) -> str:
        """The summary's words for ``kept_column_changes``: the kept columns added and dropped (or reordered)."""
        changes = self.kept_column_changes
        said = [f"{', '.join(changes[key])} {key}" for key in ("added", "dropped") if changes[key]]
        return f"kept columns changed: {'; '.join(said) or 'reordered'}"

    def _skipped_part(self) -> str:
        """``"12 skipped (empty_text 10, invalid_utf8 2)"``: the rows skipped by reason, as ``petal embed`` says
        them (README: "Null and blank texts, one rule"); ``"0 skipped"``. NOTE: was the total alone."""
        counts = {why: n for why, n in sorted(self.rows["skipped"].items()) if n}
        by_reason = f" ({', '.join(f'{why} {n}' for why, n in counts.items())})" if counts else ""
        return f"{sum(counts.values())} skipped{by_reason}"

    def summary(self) -> str:
        """The one line ``petal index`` and ``petal rebuild`` print on stderr."""
        skipped = self._skipped_part()
        parts = [f"petal {self.command}: {self.status}"]
        if self.command == "index":
            # NOTE: shards["reused"] counts the kept shards too (their vectors come from the store); the line splits
            # them out, so its three numbers add up to the total
            num_kept = len(self.shard_changes.get("kept", ()))
            kept = f", {num_kept} kept" if num_kept else ""
            reused = f", {self.rows['reused']} reused" if self.rows.get("reused") else ""
            kept_rows = f", {self.rows['kept']} kept" if self.rows.get("kept") else ""  # the kept shards' rows
            done = self.took_effect()  # else what was planned did not happen
            deleted = f", {self.rows['deleted']} deleted" if "deleted" in self.rows and done else ""
            if deleted and self.deletes.get("already_deleted"):  # asked again: removed by an earlier run, not this one
                deleted += f" ({self.deletes['already_deleted']} already deleted)"
            parts.append(
                f"{self.shards['total']} shards ({self.shards['embedded']} embedded, "
                f"{self.shards['reused'] - num_kept} reused"
                f"{kept}), {self.rows['embedded']} rows embedded{reused}{kept_rows}, {skipped}, "
                f"{self.rows['truncated']} truncated{deleted}"
            )
            if self.shard_changes and done:
                parts.append(", ".join(f"{len(v)} {k}" for k, v in self.shard_changes.items()))
            if self.kept_column_changes and done:  # NOTE: else a version without them read as "nothing changed"
                parts.append(self._kept_columns_part())
            if self.removed.get("documents") and done:  # refused (65): the error says what it would have removed
                parts.append(f"{self.removed['documents']} documents removed")
            if self.index.get("num_vectors") is not None:
                parts.append(f"{self.index['num_vectors']} vectors in {self.index.get('factory')}")
            earlier = int(self.index.get("deleted") or 0) - int(self.deletes.get("rows") or 0)
            if earlier > 0:  # tombstones of earlier runs hold (incremental, --full, rebuild): say where the rows went
                parts.append(f"{earlier} deleted earlier (by the --delete of an earlier run)")
            if self.index.get("superseded"):
                parts.append(f"{self.index['superseded']} superseded (ids also in a shard that sorts later)")
            if self.repaired:
                parts.append("the damaged live version was rebuilt from the store")
            if self.damaged_entries:
                damaged = len(self.damaged_entries)
                parts.append(f"{damaged} damaged store {'entry' if damaged == 1 else 'entries'} embedded again")
            if self.version:
                parts.append(f"version {self.version}")
            recovered = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in self.retries.items() if n)
            if recovered:
                parts.append(f"recovered: {recovered}")
        parts.append(f"{self.seconds:.1f}s")
        if self.message:
            parts.append(self.message)
        return one_line("; ".join(parts))  # NOTE: one line, whatever a path or message holds
