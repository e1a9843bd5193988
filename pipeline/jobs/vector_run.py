"""``petal index SOURCE --vectors-column emb``: index precomputed embeddings, no model.

The same path as ``petal index`` from the store on: each shard's vectors are committed as a store
entry (fingerprint: content + the vectors column and dimension), so incremental runs reuse them,
additive/``--sync``/``--delete``/``--max-removed`` hold, the index is built by the same builder
and published as a version. Bad vectors are counted skips (``pipeline/ingest/vectors.py``),
``--strict`` and ``--max-bad-rows`` apply.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from petal.pipeline.config import IndexJob
from petal.pipeline.index.columns_file import add_stored_columns
from petal.pipeline.index.files import IDS_FILE
from petal.pipeline.index.writer import build_version_index
from petal.pipeline.ingest.duplicates import check_cross_shard_duplicates
from petal.pipeline.ingest.parquet import ReadStats, ShardInfo, check_id_kinds, resolve_sources
from petal.pipeline.ingest.path_ids import check_path_ids
from petal.pipeline.ingest.rejects import rejects_table
from petal.pipeline.ingest.vectors import preflight_vectors, read_vectors
from petal.pipeline.jobs import index_run as run
from petal.pipeline.jobs.column_changes import KeptColumnsChange, say_kept_columns
from petal.pipeline.jobs.keep_columns import check_column_types, check_keep_columns, check_zones, stored_schema
from petal.pipeline.jobs.removals import kept_entries, kept_ids, kept_records, kept_shard, kept_vectors
from petal.pipeline.jobs.report import RunReport
from petal.pipeline.jobs.report_file import check_report_file, check_report_not_input, check_report_path
from petal.pipeline.layout import OutputDir, check_not_inside_output
from petal.pipeline.manifest import MANIFEST_FILE, Manifest, PrecomputedSettings, StoredColumns
from petal.pipeline.reliability.errors import ConfigError, Interrupted, NoInputError, quote_path, writing
from petal.pipeline.reliability.faults import fault
from petal.pipeline.reliability.notes import say
from petal.pipeline.reliability.safe_files import check_output_dir
from petal.pipeline.reliability.signals import StopSignals
from petal.pipeline.store.changes import live_manifest, shard_changes
from petal.pipeline.store.columns import ColumnsNeed, check_stored_text, ensure_columns, kept_schemas
from petal.pipeline.store.embeddings import EmbeddingStore, StoreEntry, settings_fingerprint, sha256_file
from petal.pipeline.store.outputs import OutputTransform
from petal.pipeline.store.tombstones import read_delete_ids, settle_tombstones


def vector_settings(column: str, dim: int, job: IndexJob) -> PrecomputedSettings:
    """What shapes a shard's stored vectors (the store fingerprint; drift is checked on it)."""
    return PrecomputedSettings(vectors_column=column, dim=dim, id_column=job.read.id_column)


def run_vector_index(job: IndexJob, column: str, report: RunReport, stop: StopSignals | None = None,
                     given: frozenset[str] | None = None) -> RunReport:
    """Index the vectors of ``column`` in ``job.sources`` into ``job.out`` (no model). ``given``: the ``job.index``
    fields the caller chose (``None``: all); the others keep the live version's, as a text run's (``run_index``).
    ``stop``: the caller's active ``StopSignals`` (the CLI's); without one, the stop signals are caught for the length
    of the run, as ``run_index`` catches them.

    NOTE: the StopSignals made here was never entered: a Python caller's run in the main thread was killed by SIGTERM
    outright and SIGINT was a KeyboardInterrupt (exit 1), where a text run stops cleanly (Interrupted, 143/130)."""
    try:
        with contextlib.nullcontext(stop) if stop is not None else StopSignals.for_caller() as active:
            return _checked_run(job, column, report, active, given)
    except Interrupted as exc:
        raise run.full_rerun_hint(exc, job) from None


def _checked_run(job: IndexJob, column: str, report: RunReport, stop: StopSignals,
                 given: frozenset[str] | None) -> RunReport:
    started = time.perf_counter()
    report.out = str(job.out)  # NOTE: as a text run: the report is never written over a file of OUT
    stop.check()  # as a text run: a signal that arrived while petal started stops the run before any check
    check_report_path(job.json_report, job.out)
    if any("://" in s and not s.lower().startswith("file://") for s in job.sources):
        raise NoInputError("--vectors-column reads local Parquet files for now; copy or mount the shards locally")
    check_output_dir("--out", job.out)  # 73 before anything is read: one petal cannot create, read or write
    check_report_file(job.json_report, job.out)
    check_not_inside_output("--out", job.out)  # 73: not inside another index's versions/ or store/
    if not job.wait:  # 75 naming the holder before any source is read, as a text run
        OutputDir(job.out).check_unlocked()
    live = run.peek_live_manifest(job.out)
    # a file named inside --out is refused and output directories are never read, as in a text run
    # --sync over a live version mirrors SOURCES that now hold no shard (the removal guard judges it), as a text run
    local = [p for p in resolve_sources(job.sources, out=job.out, empty_ok=job.sync and live is not None)
             if isinstance(p, Path)]  # remote: refused above
    check_report_not_input(job.json_report, [*local, *run.live_inputs(live), job.delete])  # 2: never over an input
    reads = ReadStats()  # OS read errors of footers and rows, retried as a text run's
    try:
        return _run(job, column, report, stop, started, live, local, reads, given)
    finally:
        report.retries["read"] = reads.retries


def _run(job: IndexJob, column: str, report: RunReport, stop: StopSignals, started: float, live: Any,
         local: list[Path], reads: ReadStats, given: frozenset[str] | None) -> RunReport:
    # NOTE: SOURCES without a vector (none left, or only empty shards) under --sync keep the live version's width
    mirrored_dim = live.dim if job.sync and live is not None else None
    shards, dim = preflight_vectors(local, job.read, column, reads, dim_if_none=mirrored_dim, check=stop.check)
    if job.full and not job.sync:  # --full reads the shards an additive run keeps again, from their files (as text)
        extra = run.full_rerun_sources(live, shards, job.sources)  # a kept shard that is gone: 78
        if extra:
            again = [p for p in resolve_sources([*job.sources, *extra], out=job.out) if isinstance(p, Path)]
            shards, dim = preflight_vectors(again, job.read, column, reads, check=stop.check)
    report.rows["total"] = sum(s.num_rows for s in shards)
    # the schemas preflight read (no second read of a source)
    text = job.read.text_column if all(s.schema is not None and job.read.text_column in s.schema.names
                                       for s in shards) else None
    if text is not None:
        check_zones(shards, [text], "--text-column")  # NOTE: stored as text: a cast that needs the zone
        check_stored_text(shards, text)
    check_keep_columns(shards, job.keep_columns, (column, job.read.id_column), job.read, reads)
    need = ColumnsNeed(text, job.keep_columns)
    delete_ids = read_delete_ids(job.delete, job.read.id_column, job.read, reads) if job.delete is not None else None
    kept_before = kept_records(live, shards, job.sync)
    index_settings = run.IndexSettingsCheck(job.index, given, "float32", dim,
                                            report.rows["total"] + kept_vectors(kept_before))
    job = index_settings.of(job, live)  # the live version's where not given, the factory checked
    settings = vector_settings(column, dim, job)
    report.model = {"source": "precomputed", "vectors_column": column, "dim": dim}
    out = OutputDir(job.out, report.pruned["left"])
    out.prepare()
    report.out = str(out.root)
    report.timings_s["preflight"] = round(time.perf_counter() - started, 3)
    fault("after_preflight")  # NOTE: the text run's fault points at the same steps (the crash-point sweep's)

    with out.lock(wait=job.wait, on_wait=say, check=stop.check):
        fault("after_lock")
        started_from = out.started_from()  # NOTE: what the publish swaps CURRENT from (changed by hand since: 75)
        report.pruned["versions"] = out.removed_versions(out.clean_orphans())
        settle_tombstones(out, say)  # what a run killed around its publish left: its deletion holds iff published
        previous = None if job.full else run.live_or_refuse(out)  # damaged: 78 with the way out (--full)
        job = index_settings.of(job, live_manifest(out) if job.full else previous)  # another writer may have published
        if previous is not None:
            check_kept_dim(previous, dim, shards, job.sync, out.root)
            run.check_drift(previous, settings, out.root)
        # a damaged entry embedded again is reported, and so is what cannot be deleted
        store = EmbeddingStore(out.store_dir, report.damaged_entries, out.left)
        with writing(out.store_dir):
            store.open()
            if job.full:  # NOTE: its commits are stamped, so that a rerun after a stop resumes it (RELIABILITY 3)
                store.begin_full_run(out.publish_mark())
        kept_recs = kept_records(previous, shards, job.sync)
        kept = kept_entries(store, kept_recs, out.root)
        kept_infos = [kept_shard(r, e) for r, e in zip(kept_recs, kept)]
        check_id_kinds([*shards, *kept_infos], job.read.id_column)  # 65: kept shards' ids of another kind
        # --keep-columns in the kept shards: there (65), of a type that widens with the named shards' (65), their
        # files still there where the store lacks them (78)
        check_column_types(shards, job.keep_columns, kept_schemas(kept, job.keep_columns, job.read, reads), job.read,
                           reads, stored_schema(out.version_dir(previous.version) / IDS_FILE if previous else None))
        if job.strict:  # an id in two shards is a bad row too (without --strict the last shard wins), kept ones too
            check_cross_shard_duplicates(shards, job.read, reads, kept_ids(kept))
        fp = settings_fingerprint(settings.to_dict())
        fingerprints = [run.content_fingerprint(store, info, fp, job.read, reads) for info in shards]
        all_shards = sorted([*shards, *kept_infos], key=lambda info: info.abs_path)
        shard_paths = run.recorded_paths(all_shards)  # the shard column of ids.parquet and the rejects
        sha = {info.abs_path: store.content_sha256(info) for info in shards}
        sha.update({r.abs_path: r.sha256 for r in kept_recs})
        report.shard_changes = shard_changes(previous if not job.full else live_manifest(out), all_shards,
                                             [sha[i.abs_path] for i in all_shards],
                                             frozenset(i.abs_path for i in kept_infos))
        columns_change = KeptColumnsChange.between(previous if not job.full else live_manifest(out), job.keep_columns)
        report.kept_column_changes = columns_change.as_dict() if columns_change is not None else {}
        report.shards["total"] = len(all_shards)
        report.shards["reused"] = len(kept)  # NOTE: with shard_changes["kept"]: a failed run said "-1 reused"
        live_checked = run.live_before_lookup(out, previous, shards, fingerprints, kept_recs, job, delete_ids, report,
                                              stop)
        # NOTE: --full reads every shard again, but for what the stopped --full run it resumes committed
        entries = store.lookup_all(shards, fingerprints, job.full, verify=not live_checked)
        check_path_ids(shards, entries, kept_infos, kept)  # 65: two files whose '<shard>:<row>' ids are the same
        gate = run.bad_row_gate(job, report, out)
        if gate is not None:
            gate.shard_paths = shard_paths
        for entry in entries:
            if entry is not None and gate is not None:
                gate.reuse(entry)
        embedded_now: set[int] = set()
        for i, info in enumerate(shards):
            if entries[i] is not None:
                report.shards["reused"] += 1
                continue
            stop.check()
            entry = _store_shard(store, info, fingerprints[i], settings, column, dim, job, gate, i, reads)
            entries[i] = entry
            embedded_now.add(i)
            report.shards["embedded"] += 1
            run.tally_commit(entry, report)  # NOTE: a run stopped here reports the rows it did store
            fault("after_shard_commit", entry.path)
        named = [e for e in entries if e is not None]
        run.tally_rows(named, report, embedded_now, kept)
        by_path = {i.abs_path: e for i, e in zip([*shards, *kept_infos], [*named, *kept])}
        committed = [by_path[i.abs_path] for i in all_shards]
        # --delete: planned here, written once the guard has passed (as petal index's text runs: one code path)
        committed, deletion = run.plan_deletions(out, store, committed, delete_ids, report)
        pending = deletion.pending_counts() if deletion is not None else None
        ensure_columns(store, committed, need, {i.abs_path: i for i in shards}, job.read, reads)
        run.check_rows_to_index(out, job, committed, report)  # 66, or --sync mirroring no rows (the guard judges)
        same = previous is not None and run.unchanged(previous, all_shards, committed, job, pending)
        # a damaged live version: rebuilt from the store
        if run.published_nothing(out, previous, same, report, stop, live_checked, store, named, embedded_now):
            run.report_live_version(out, report)
            run.clean_up(out, store, committed, job, report, stop)
            store.end_full_run()  # a run succeeded with the live version: a stopped --full is not resumed after it
            stop.check()  # a signal while cleaning up: the live version stays, the exit code is the signal's
            report.finish("nothing-to-do", 0, "no shard or setting changed; the live version stays")
            return report
        run.guard_removals(out, job, all_shards, committed, delete_ids, report)  # exit 65 before anything is published
        if deletion is not None:  # the build leaves the planned rows out; the tombstones are written at the publish
            committed = deletion.apply(committed)
        stop.check()
        transform = OutputTransform(model_dim=dim, dim=dim, renormalize=False, cosine=False)
        with writing(out.versions_dir):
            staging = out.staging_dir()
        try:
            with writing(staging):
                fault("before_index_build", staging / "index.faiss")
                result = build_version_index(committed, dim, job.index, staging, transform,  # FAISS errors: 78
                                             shard_paths=shard_paths)
                fault("after_index_build", staging / MANIFEST_FILE)
                pq.write_table(rejects_table(committed, shard_paths=shard_paths), staging / "rejects.parquet",
                               write_page_checksum=True)
                stored = add_stored_columns(committed, dim, need, staging, job.read)
                if stored:
                    result.files[IDS_FILE] = sha256_file(staging / IDS_FILE)
                version = out.new_version_id()
                run.vector_manifest(version, settings, job, all_shards, committed, result, transform,
                                    StoredColumns(bool(text), tuple(job.keep_columns)) if stored else None
                                    ).write(staging / MANIFEST_FILE)
            stop.check()
            # --delete's tombstones take effect with it
            run.publish_version(out, staging, version, deletion, job.keep_versions, started_from)
        except BaseException:
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
            raise
        report.version = version  # NOTE: live from here: a stop or failure after this still published (and deleted)
        fault("after_publish")
        store.end_full_run()  # a version is live: no --full run is left to resume
        committed_tombstones = run.commit_tombstones(out, deletion)
        report.index = {**result.report(job.index), "deleted": sum(run.tombstoned(e) for e in committed)}
        run.say_recall(result)
        say_kept_columns(columns_change)
        report.rejects_file = str(out.version_dir(version) / "rejects.parquet")
        cleaned = False
        if committed_tombstones:  # NOTE: else clean-up would prune the staged tombstones the live version holds to
            cleaned = run.clean_up(out, store, committed, job, report, stop, (version, started_from.version))
    run.stopped_after_publish(stop, version, cleaned)
    report.finish("success", 0)
    return report


def check_kept_dim(previous: Manifest, dim: int, shards: list[ShardInfo], sync: bool, out: Path) -> None:
    """78 when the run's vectors have another dimension than the live version's and an additive run would keep live
    shards it does not name: ``--full`` alone reads those again (65: two dimensions), so the way out says ``--sync``."""
    was = previous.embedding
    kept = kept_records(previous, shards, sync)
    if not isinstance(was, PrecomputedSettings) or was.dim == dim or not kept:
        return
    more = f" and {len(kept) - 1} more" if len(kept) > 1 else ""
    raise ConfigError(f"{quote_path(out)} holds vectors of {was.dim} dimensions and these shards {dim}; the live "
                      f"version's other shards ({quote_path(kept[0].abs_path)}{more}) hold {was.dim} and an additive "
                      "run keeps them (--full reads them again): pass --full --sync --max-removed 100% to index these "
                      "shards alone, or index them into another --out")


def _store_shard(store: EmbeddingStore, info: ShardInfo, fingerprint: str, settings: PrecomputedSettings,
                 column: str, dim: int, job: IndexJob, gate: Any, position: int, reads: ReadStats) -> StoreEntry:
    writer = store.writer(info, fingerprint, settings.to_dict(), dim)
    try:
        writer.input_done = True
        for batch in read_vectors(info, job.read, column, dim, reads):
            if gate is not None:
                gate.add(position, str(info.path), batch.rejects)
            writer.reject(batch.rejects)
            if batch.rows:
                writer.add(batch.rows, batch.ids, batch.vectors)
        entry = writer.commit()
    except BaseException:
        writer.abort()
        raise
    if gate is not None:
        gate.commit(position, entry)
    return entry
