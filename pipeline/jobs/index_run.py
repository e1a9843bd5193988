"""``petal index``, top to bottom: read -> tokenize -> pack -> step -> result -> store -> index.

Every check that can fail on the user's input or settings runs before the model loads: each footer
and schema (65), the model's files (78), the index factory (2), the output directory (73), the
writer lock (75), the live version's settings (78). Shards already embedded with the same content
and settings are reused from the store; the index is always built from the store and published as
a new version by one atomic pointer swap.

SIGINT/SIGTERM stop the run at the next batch boundary or phase (``stop.check()``); committed shards
stay. Fault points (``fault(...)``, pipeline/reliability/faults.py) mark every step a crash test interrupts.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import pyarrow as pa
import pyarrow.parquet as pq

from petal import __version__
from petal.engine.config import DeviceName, EngineConfig
from petal.engine.loader import ModelSpec
from petal.engine.models.families import same_architecture
from petal.pipeline.config import IndexJob, IndexSettings, ReadConfig, default_token_budget
from petal.pipeline.index.columns_file import add_stored_columns
from petal.pipeline.index.files import IDS_FILE
from petal.pipeline.index.plan import index_kind
from petal.pipeline.index.writer import BuildResult, build_version_index
from petal.pipeline.ingest.documents import read_ranges
from petal.pipeline.ingest.duplicates import check_cross_shard_duplicates
from petal.pipeline.ingest.pack import PackConfig, Packer
from petal.pipeline.ingest.parquet import (
    ReadStats,
    ShardInfo,
    check_id_kinds,
    preflight,
    read_retrying,
    resolve_sources,
    string_ids,
)
from petal.pipeline.ingest.path_ids import check_path_ids
from petal.pipeline.ingest.prefetch import Prefetcher
from petal.pipeline.ingest.rejects import BadRowGate, rejects_table
from petal.pipeline.ingest.remote import (
    CHAIN_ENDPOINT,
    RemotePath,
    chain_of,
    is_azure,
    is_uri,
    namenode_spelling,
    names_no_account,
    names_no_endpoint,
    names_no_namenode,
    object_spelling,
    older_uris,
    open_stored,
    reached_by,
    spelled_otherwise,
    storage_error,
    stored_with_options,
)
from petal.pipeline.ingest.tokens import TokenizedDocs, tokenize_documents, tokenizer_for
from petal.pipeline.jobs.column_changes import KeptColumnsChange, say_kept_columns
from petal.pipeline.jobs.keep_columns import check_column_types, check_keep_columns, stored_schema
from petal.pipeline.jobs.live_check import live_damage
from petal.pipeline.jobs.model import model_spec
from petal.pipeline.jobs.progress import progress_bar
from petal.pipeline.jobs.removals import (
    RemovalLimit,
    check_removal,
    dropped_entries,
    kept_entries,
    kept_ids,
    kept_records,
    kept_shard,
    kept_vectors,
    live_version_documents,
    live_version_ids,
    removed_by_counts,
    removed_documents,
)
from petal.pipeline.jobs.report import RunReport
from petal.pipeline.jobs.report_file import check_report_file, check_report_not_input, check_report_path
from petal.pipeline.jobs.settings import check_kept_factory, kept_settings
from petal.pipeline.jobs.weights_hash import FileStat, WeightsHash, with_weights_sha256
from petal.pipeline.layout import OutputDir, StartedFrom, check_not_inside_output
from petal.pipeline.manifest import (
    MANIFEST_FILE,
    Counts,
    EmbeddingSettings,
    Manifest,
    ModelRecord,
    PrecomputedRecord,
    PrecomputedSettings,
    ReadRecord,
    ShardRecord,
    StoredColumns,
)
from petal.pipeline.reliability.errors import (
    FULL_RERUN,
    ConfigError,
    FlagError,
    Interrupted,
    NoInputError,
    PetalError,
    PetalIOError,
    flag_errors,
    one_line,
    quote_path,
    writing,
)
from petal.pipeline.reliability.faults import fault
from petal.pipeline.reliability.notes import say
from petal.pipeline.reliability.safe_files import check_output_dir
from petal.pipeline.reliability.signals import StopSignals
from petal.pipeline.store.changes import live_manifest, shard_changes
from petal.pipeline.store.columns import ColumnsNeed, ensure_columns, kept_schemas
from petal.pipeline.store.embeddings import (
    DeferredIdentity,
    EmbeddingStore,
    StoreEntry,
    StoreSink,
    settings_fingerprint,
    shard_key,
)
from petal.pipeline.store.outputs import OutputTransform
from petal.pipeline.store.retention import entries_used_now, prune_unused, say_unused
from petal.pipeline.store.tombstones import (
    DeleteIds,
    Deletion,
    apply_deletes,
    carry_deletions,
    read_delete_ids,
    settle_tombstones,
    tombstoned,
)

if TYPE_CHECKING:
    from petal.engine.engine import Engine

# NOTE: the engine (torch) is imported where a run embeds: `petal index --vectors-column` shares this
# module's helpers and needs neither
EngineFactory = Callable[[ModelSpec, EngineConfig], "Engine"]


def default_engine(spec: ModelSpec, config: EngineConfig) -> Engine:
    """The ``Engine``, imported (with torch) only when a run gets to load its model; picklable for workers."""
    from petal.engine.engine import Engine

    return Engine(spec, config)


def check_lengths_for(job: IndexJob, spec: ModelSpec) -> None:
    """``--max-length``, ``--token-budget`` and ``--query-prompt`` against the model, before torch loads and before OUT
    is created or locked (``FlagError``, 2): a budget under the max length, a max length its special tokens and a
    prompt (the document's, or the query's the index keeps for its queries) fill (were
    found once the engine was configured, torch imported, or at the first batch, OUT created and locked); the same
    from the model's files alone is a ``ConfigError`` (78) naming them."""
    if job.token_budget is not None and job.token_budget < spec.pooling.max_length:
        raise FlagError(f"token budget {job.token_budget} < max length {spec.pooling.max_length}: "
                        "raise --token-budget or lower --max-length")
    # NOTE: always, flags or not: the model's own prompts (config_sentence_transformers.json) beside its own max
    # length were judged only at the first batch, OUT created and locked (the document's), or never (the query's: an
    # index published at exit 0 whose every query failed). 2 naming a flag that set them, else 78 naming the files
    tokenizer_for(spec)  # NOTE: its room check (TextTokenizer): the document prompt and special tokens
    tokenizer_for(spec, "query")


def engine_config(job: IndexJob, spec: ModelSpec) -> EngineConfig:
    from petal.engine.engine import attention_backend, resolve_device, resolve_dtype

    if job.scale is not None:  # NOTE: the scale-out settings of the environment, 78 before Ray or any worker starts
        from petal.pipeline.jobs.workers import start_timeout_s

        start_timeout_s()
    if job.scale is not None and job.scale.ray:  # the actors' device: the Ray cluster's GPUs, not this process's
        from petal.pipeline.jobs.ray_embed import ray_device

        device = ray_device(job.device, job.scale)
    else:
        device = resolve_device(job.device)
    budget = job.token_budget or default_token_budget(device, spec.pooling.max_length)
    if budget < spec.pooling.max_length:
        raise FlagError(f"token budget {budget} < max length {spec.pooling.max_length}: "
                         "raise --token-budget or lower --max-length")
    return EngineConfig(device=cast("DeviceName", device), dtype=resolve_dtype(job.dtype, device),
                        attention=attention_backend(job.attention), cuda_graphs=job.cuda_graphs,
                        token_budget=budget, max_seqs=job.max_seqs)


def embedding_settings(spec: ModelSpec, config: EngineConfig, job: IndexJob,
                       previous: Manifest | None = None) -> EmbeddingSettings:
    """Everything that shapes a shard's vectors (the store fingerprint; drift is checked on it). Updating an index
    built before petal recorded the model's config leaves it out, as that index did, and one that recorded an older
    name of the model's architecture (a RoBERTa index's xlm-roberta) keeps that name (its store entries keep their
    fingerprints); a --full rebuild or a new output records them as they are."""
    settings = EmbeddingSettings.for_run(spec, config.dtype, job.read.text_column, job.read.id_column,
                                         OutputTransform.for_model(spec, job.output))
    if previous is None or not isinstance(previous.embedding, EmbeddingSettings):
        return settings
    recorded = previous.embedding.architecture
    if recorded != settings.architecture and same_architecture(recorded, settings.architecture):
        settings = settings.named(recorded)
    return settings.without_model_config() if previous.embedding.model_config is None else settings


def run_index(job: IndexJob, report: RunReport, engine_factory: EngineFactory | None = None,
              stop: StopSignals | None = None, given: frozenset[str] | None = None) -> RunReport:
    """Index ``job.sources`` into ``job.out``. Raises ``PetalError`` subclasses for the user's mistakes.

    ``given``: the ``job.index`` fields the caller chose (``None``: all of them); every other one keeps the live
    version's (``kept_settings``, as ``petal rebuild``: a ``--metric l2`` rebuild stays l2 under the next cron run),
    ``--full`` too while the live manifest is readable (NOTE: it re-embeds, it does not forget the index the user
    chose; an unreadable one gives the defaults, as a first run).

    ``stop``: the caller's active ``StopSignals`` (the CLI catches signals from its first line);
    without one, SIGINT/SIGTERM are caught for the length of the run. ``engine_factory``: the ``Engine``
    class unless a test replaces it.
    """
    if engine_factory is None:
        engine_factory = default_engine
    reads = ReadStats()
    try:
        with contextlib.nullcontext(stop) if stop is not None else StopSignals.for_caller() as active:
            return _run_index(job, report, engine_factory, active, reads, given)
    except Interrupted as exc:
        raise full_rerun_hint(exc, job) from None
    finally:
        report.retries["read"] = reads.retries


def _run_index(job: IndexJob, report: RunReport, engine_factory: EngineFactory, stop: StopSignals,
               reads: ReadStats, given: frozenset[str] | None) -> RunReport:
    started = time.perf_counter()
    report.out = str(job.out)  # NOTE: before any check: the report is never written over a file of OUT
    stop.check()  # a signal that arrived while petal started (its imports) stops the run before any check
    check_report_path(job.json_report, job.out)  # 2: --json-report OUT/CURRENT would break the index it reports on
    check_output_dir("--out", job.out)  # 73 before anything is read: one petal cannot create, read or write
    check_report_file(job.json_report, job.out)  # 73: a report that cannot be written, said before any work
    check_not_inside_output("--out", job.out)  # 73: not inside another index's versions/ or store/
    if not job.wait:  # 75 naming the holder before any source is read (the lock itself is taken after preflight)
        OutputDir(job.out).check_unlocked()
    # [0] preflight: every footer and schema, the model's files, the settings, the output directory
    live = peek_live_manifest(job.out)  # read-only here; re-read under the lock
    named = named_sources(job, live)
    check_report_not_input(job.json_report, [*named, *live_inputs(live), job.delete])  # 2: never over an input
    shards = preflight(named, job.read, reads, check=stop.check)
    if job.full and not job.sync:  # --full re-embeds the shards an additive run keeps, from their files
        extra = full_rerun_sources(live, shards, job.sources)
        if extra:
            shards = preflight(resolve_sources([*job.sources, *extra], out=job.out), job.read, reads, check=stop.check)
    report.rows["total"] = sum(s.num_rows for s in shards)
    check_keep_columns(shards, job.keep_columns, (job.read.text_column, job.read.id_column), job.read, reads)
    need = ColumnsNeed(job.read.text_column, job.keep_columns)
    delete_ids = read_delete_ids(job.delete, job.read.id_column, job.read, reads) if job.delete is not None else None
    if delete_ids is not None:
        check_delete_ids(delete_ids, shards, kept_records(live, shards, job.sync))  # 65 before the model loads
    spec = model_spec(job.model, job.max_length, job.model_options)
    check_lengths_for(job, spec)
    weights = start_weights_hash(spec)  # [0a] sha256 of the weights in the background (joined before it is used)
    try:
        return _checked_run(job, report, engine_factory, stop, reads, started, live, shards, need, delete_ids,
                            spec, weights, given)
    finally:
        weights.cancel()  # NOTE: a run that ended early stops reading the weights; a finished hash is kept


def _checked_run(job: IndexJob, report: RunReport, engine_factory: EngineFactory, stop: StopSignals,
                 reads: ReadStats, started: float, live: Manifest | None, shards: list[ShardInfo], need: ColumnsNeed,
                 delete_ids: DeleteIds | None, spec: ModelSpec, weights: WeightsHash,
                 given: frozenset[str] | None) -> RunReport:
    transform = OutputTransform.for_model(spec, job.output)  # --dim, --quantize, --output-dtype
    # the index settings kept from the live version; the factory against the output format, the dimension and (at
    # most) the rows read + the kept shards'
    index_settings = IndexSettingsCheck(job.index, given, index_kind(transform.quantize, transform.output_dtype),
                                        transform.dim, report.rows["total"] + kept_vectors(
                                            kept_records(live, shards, job.sync or job.full)))
    job = index_settings.of(job, live)
    with flag_errors():  # --device, --dtype, --attention, --token-budget against this host and model (imports torch)
        config = engine_config(job, spec)
    out = OutputDir(job.out, report.pruned["left"])
    out.prepare()
    report.out = str(out.root)
    report.timings_s["preflight"] = round(time.perf_counter() - started, 3)
    fault("after_preflight")
    stop.check()

    locking = time.perf_counter()
    with out.lock(wait=job.wait, on_wait=say, check=stop.check):
        checks_started = time.perf_counter()
        report.timings_s["lock_wait"] = round(checks_started - locking, 3)
        fault("after_lock")
        started_from = out.started_from()  # NOTE: what the publish swaps CURRENT from (changed by hand since: 75)
        report.pruned["versions"] = out.removed_versions(out.clean_orphans())
        settle_tombstones(out, say)  # what a run killed around its publish left: its deletion holds iff it published
        previous = None if job.full else live_or_refuse(out)  # --full: even an unreadable live version
        job = index_settings.of(job, live_manifest(out) if job.full else previous)  # another writer may have published
        # the weights' sha256: recorded beside the same stat (verified later), or hashed by now (the drift check
        # needs it before the model loads); None: nothing to compare or look up, it is needed once the model is loaded
        used_sha = known_weights_sha256(weights, previous)
        if previous is not None:
            used_sha = used_sha or weights.result()
            check_drift(previous, embedding_settings(with_weights_sha256(spec, used_sha), config, job, previous),
                        out.root)
        # a damaged entry embedded again is reported, and so is what cannot be deleted
        store = EmbeddingStore(out.store_dir, report.damaged_entries, out.left)
        with writing(out.store_dir):
            store.open()
        kept_recs = kept_records(previous, shards, job.sync)  # additive: the live shards not named (by abs path)
        kept = kept_entries(store, kept_recs, out.root)
        kept_infos = [kept_shard(r, e) for r, e in zip(kept_recs, kept)]
        check_id_kinds([*shards, *kept_infos], job.read.id_column)  # 65: kept shards' ids of another kind
        # --keep-columns in the kept shards: there (65), of a type that widens with the named shards' (65), their
        # files still there where the store lacks them (78)
        check_column_types(shards, job.keep_columns, kept_schemas(kept, job.keep_columns, job.read, reads), job.read,
                           reads, stored_schema(out.version_dir(previous.version) / IDS_FILE if previous else None))
        if job.strict:  # an id in two shards is a bad row too (without --strict the last shard wins), kept ones too
            check_cross_shard_duplicates(shards, job.read, reads, kept_ids(kept))
        if job.full:  # NOTE: its commits are stamped, so that a rerun after a stop resumes it (RELIABILITY 3)
            with writing(out.store_dir):
                store.begin_full_run(out.publish_mark())
        if used_sha is None and (job.scale is not None or ((not job.full or store.full_run_resumed)
                                                           and stored_any(store, shards))):
            used_sha = weights.result()  # store entries to look up (a resumed run), or workers that pickle the spec
        sha = {}
        for info in shards:  # each shard whose stat changed is read whole: a stop signal ends the phase between two
            stop.check()
            sha[info.abs_path] = content_sha256(store, info, job.read, reads)
        identity = RunIdentity(spec, config, job, weights, used_sha, previous)
        if used_sha is not None:  # else once the model is loaded (a fresh output: the hash runs beside the load)
            report.model = identity.spec().describe()
        fingerprints = identity.fingerprints(store, shards) if used_sha is not None else None
        all_shards = sorted([*shards, *kept_infos], key=lambda info: info.abs_path)
        shard_paths = recorded_paths(all_shards)  # the shard column of ids.parquet and the rejects
        sha.update({r.abs_path: r.sha256 for r in kept_recs})
        report.shard_changes = shard_changes(previous if not job.full else live_manifest(out), all_shards,
                                             [sha[info.abs_path] for info in all_shards],
                                             frozenset(info.abs_path for info in kept_infos))
        columns_change = KeptColumnsChange.between(previous if not job.full else live_manifest(out), job.keep_columns)
        report.kept_column_changes = columns_change.as_dict() if columns_change is not None else {}
        report.shards["total"] = len(all_shards)
        report.shards["reused"] = len(kept)  # NOTE: with shard_changes["kept"]: a failed run said "-1 reused"
        live_checked = live_before_lookup(out, previous, shards, fingerprints, kept_recs, job, delete_ids, report, stop)
        # NOTE: --full embeds every shard again, but for what the stopped --full run it resumes committed
        entries: list[StoreEntry | None] = [None] * len(shards) if fingerprints is None else \
            store.lookup_all(shards, fingerprints, job.full, verify=not live_checked)
        check_path_ids(shards, entries, kept_infos, kept)  # 65: two files whose '<shard>:<row>' ids are the same
        todo = [i for i, entry in enumerate(entries) if entry is None]
        report.shards["reused"] += len(shards) - len(todo)
        gate = bad_row_gate(job, report, out)
        if gate is not None:
            gate.shard_paths = shard_paths
            for entry in entries:
                if entry is not None:
                    gate.reuse(entry)  # refused before the model loads when reused shards are over already
        stop.check()

        # under the lock, before any embedding: drift, store, source fingerprints, lookups (serial)
        report.timings_s["checks"] = round(time.perf_counter() - checks_started, 3)
        embedded_now: set[int] = set()  # positions in ``shards`` embedded by this run
        if todo:
            embed_started = time.perf_counter()
            todo_shards = [shards[i] for i in todo]
            if job.scale is None:
                commits = embed_in_process(todo_shards, identity, store, spec, config, engine_factory, transform, job,
                                           report, stop, gate, reads)
            else:  # --devices/--workers/--ray: worker processes (or Ray actors) embed and commit
                from petal.pipeline.jobs.scaled import embed_scaled

                identity.verify()  # NOTE: workers commit on their own: the weights are what was checked, first
                commits = embed_scaled(job, todo_shards, identity.fingerprints(store, todo_shards), store,
                                       identity.settings().to_dict(), identity.spec(), config, engine_factory,
                                       transform, report, stop, reads)
            # NOTE: closed inside the lock, so uncommitted shards are dropped before another writer can start.
            with contextlib.closing(cast(Generator[tuple[int, StoreEntry], None, None], commits)):  # generators
                for position, entry in commits:
                    entries[todo[position]] = entry
                    embedded_now.add(todo[position])
                    report.shards["embedded"] += 1
                    tally_commit(entry, report)  # NOTE: a run stopped here reports the rows it did embed
                    fault("after_shard_commit", entry.path)
                    if gate is not None:
                        gate.commit(position, entry)
            # the embed phase once the model is ready (the load itself is model_load_wait)
            report.timings_s["embed"] = round(time.perf_counter() - embed_started
                                              - report.timings_s.get("model_load_wait", 0.0), 3)

        named = [e for e in entries if e is not None]
        assert len(named) == len(shards)
        identity.verify()  # NOTE: before anything is published (or called unchanged): the weights are the checked ones
        spec, settings = identity.spec(), identity.settings()
        report.model = spec.describe()
        tally_rows(named, report, embedded_now, kept)
        by_path = {info.abs_path: e for info, e in zip([*shards, *kept_infos], [*named, *kept])}
        shards, committed = all_shards, [by_path[info.abs_path] for info in all_shards]
        # --delete: planned here, written once the guard has passed (a refused run leaves no tombstone behind)
        committed, deletion = plan_deletions(out, store, committed, delete_ids, report)
        pending = deletion.pending_counts() if deletion is not None else None
        no_text = ensure_columns(store, committed, need, {i.abs_path: i for i in all_shards if i.schema is not None},
                                 job.read, reads, stop.check)  # the shards preflight read (kept ones: no schema here)
        if no_text:
            say(f"warning: the text of {len(no_text)} kept shards is not stored (their files are gone or changed), "
                 f"e.g. {no_text[0]}: --show-text has none for their hits")
        check_rows_to_index(out, job, committed, report)
        same = previous is not None and unchanged(previous, shards, committed, job, pending) and \
            same_query_prompt(previous, spec)
        if published_nothing(out, previous, same, report, stop, live_checked, store, named, embedded_now):
            report_live_version(out, report)
            clean_up(out, store, committed, job, report, stop)
            store.end_full_run()  # a run succeeded with the live version: a stopped --full is not resumed after it
            stop.check()  # a signal while cleaning up: the live version stays, the exit code is the signal's
            report.finish("nothing-to-do", 0, "no shard or setting changed; the live version stays")
            return report
        guard_removals(out, job, shards, committed, delete_ids, report)  # exit 65 before anything is published
        if deletion is not None:  # the build leaves the planned rows out; the tombstones are written at the publish
            committed = deletion.apply(committed)
        stop.check()

        # [7] index: built from the store, written beside the live version, published atomically
        index_started = time.perf_counter()
        with writing(out.versions_dir):
            staging = out.staging_dir()
        result: BuildResult | None = None
        try:
            with writing(staging):
                fault("before_index_build", staging / "index.faiss")
                # the index type follows the output format; int8 learns its calibration here. A FAISS
                # error is 78 (the embeddings stay in the store); write errors go on to writing() (74)
                # the files' checksums run in the background while the rest of the version is written
                result = build_version_index(committed, transform.dim, job.index, staging, transform, wait=False,
                                             shard_paths=shard_paths)
                transform = result.output or transform
                fault("after_index_build", staging / MANIFEST_FILE)
                t0 = time.perf_counter()
                pq.write_table(rejects_table(committed, shard_paths=shard_paths), staging / "rejects.parquet",
                               write_page_checksum=True)
                stored = add_stored_columns(committed, transform.dim, need, staging, job.read)  # text, kept
                if stored and result.pending is not None:
                    result.pending.add(staging / IDS_FILE)  # rewritten with the stored columns
                result.timings_s["columns"] = round(time.perf_counter() - t0, 3)
                result.join_checksums()
                version = out.new_version_id()
                # the transform queries apply, with the int8 calibration the index learned; stored columns:
                # in ids.parquet, the text (as "text") and --keep-columns, by FAISS id
                make_manifest(version, spec, settings, job, shards, committed, result, transform,
                              StoredColumns(True, tuple(job.keep_columns)) if stored else None,
                              weights.stat_to_record()).write(staging / MANIFEST_FILE)
            stop.check()  # NOTE: the last stop: once the pointer swaps, the run is done and ends as a success
            t0 = time.perf_counter()
            # --delete's tombstones take effect with it
            publish_version(out, staging, version, deletion, job.keep_versions, started_from)
            published_s = time.perf_counter() - t0
        except BaseException:
            if result is not None and result.pending is not None:
                result.pending.cancel()
            shutil.rmtree(staging, ignore_errors=True)  # gone by now if the rename happened
            raise
        report.version = version  # NOTE: live from here: a stop or failure after this still published (and deleted)
        fault("after_publish")
        store.end_full_run()  # a version is live: no --full run is left to resume
        committed_tombstones = commit_tombstones(out, deletion)
        report.timings_s["index"] = round(time.perf_counter() - index_started, 3)
        report.index = {**result.report(job.index), "deleted": sum(tombstoned(e) for e in committed)}
        say_recall(result)
        say_kept_columns(columns_change)
        report.index["timings_s"]["publish"] = round(published_s, 3)  # fsync, rename, pointer swap
        report.rejects_file = str(out.version_dir(version) / "rejects.parquet")
        t0 = time.perf_counter()
        cleaned = False
        if committed_tombstones:  # NOTE: else clean-up would prune the staged tombstones the live version holds to
            cleaned = clean_up(out, store, committed, job, report, stop, (version, started_from.version))
        report.timings_s["clean_up"] = round(time.perf_counter() - t0, 3)
    stopped_after_publish(stop, version, cleaned)
    report.finish("success", 0)
    return report


def stopped_after_publish(stop: StopSignals, version: str, cleaned: bool = False) -> None:
    """A stop signal that arrived once the run was past its last stop (while the version was published or old ones
    pruned): ``Interrupted`` (130/143, as any stop) whose message says the version is live and whether the clean-up
    was done (``cleaned``) or is left to the next run (``clean_up`` stops at its next step)."""
    if stop.signum is not None:
        raise Interrupted(stop.signum, live_version=version, cleaned=cleaned)


def embed_in_process(shards: list[ShardInfo], identity: RunIdentity, store: EmbeddingStore, spec: ModelSpec,
                     config: EngineConfig, engine_factory: EngineFactory, transform: OutputTransform, job: IndexJob,
                     report: RunReport, stop: StopSignals, gate: BadRowGate | None,
                     reads: ReadStats) -> Iterator[tuple[int, StoreEntry]]:
    """The embed phase in this process: read, tokenize (background threads), step, store; yields commits.
    The weights' sha256 (``identity``) is settled once the model is loaded, before the first commit."""
    from petal.pipeline.store.ranges import RangeAssembly, plan_ranges, whole_shards

    tokenizer = tokenizer_for(spec)  # document prompt, EOS for last-token pooling
    # whole shards; a shard is cut in this process only where an earlier scaled run committed ranges of it
    # NOTE: committed ranges are found by fingerprint; a run whose sha256 is not settled yet has none to find
    # (run_index settles it up front when the store holds entries or ranges of these shards).
    plan = plan_ranges(store, shards, identity.fingerprints(store, shards), 0, job.read, reads, full=job.full) \
        if identity.settled else whole_shards(shards)
    documents = read_ranges(shards, plan.ranges, job.read, reads)  # [1] read (streamed)
    # [2] tokenize in the background; it starts now, so it overlaps the model load and CUDA init
    chunks = Prefetcher(tokenize_documents(documents, tokenizer, job.tokenize_workers or 1), depth=16)
    waited = time.perf_counter()
    try:
        with flag_errors():  # a device or kernel the flags asked for and this host lacks
            engine = engine_factory(spec, config)
        fault("after_model_load")
    except BaseException as exc:
        chunks.close()
        _reraise(exc)
    report.engine = engine.describe()
    report.timings_s["model_load"] = round(engine.stats.model_load_s, 3)
    report.timings_s["model_load_wait"] = round(time.perf_counter() - waited, 3)
    if not identity.settled:
        # NOTE: a fresh output: the weights' sha256 names the store entries, so the first commit needs it; the
        # hash keeps running beside the first steps, and the sink waits for what is left of it (then checks it).
        # The plan is whole shards, so nothing else (no range assembly) uses the fingerprints.
        deferred = DeferredIdentity(lambda: _settle(identity, store, shards, report))
        with contextlib.closing(embed_shards(chunks, shards, deferred, store, None, engine, transform, job,
                                             report, stop, gate)) as commits:
            yield from commits
        report.engine["stats"] = engine.stats.as_dict()
        return
    hashed = time.perf_counter()
    try:
        identity.verify()  # a sha256 taken from a recorded stat: the background hash must confirm it
        fingerprints, settings = identity.fingerprints(store, shards), identity.settings().to_dict()
    except BaseException:
        chunks.close()
        raise
    report.timings_s["weights_sha256_wait"] = round(time.perf_counter() - hashed, 3)
    assembly = RangeAssembly(store, shards, fingerprints, settings, transform.dim, plan)
    yield from assembly.ready()
    try:
        with contextlib.closing(embed_shards(chunks, shards, fingerprints, store, settings, engine, transform, job,
                                             report, stop, gate, plan.ranges)) as commits:
            for unit, entry in commits:
                yield from assembly.commit(unit, entry)
    finally:
        if plan.split:
            report.ranges = assembly.report(0)
    report.engine["stats"] = engine.stats.as_dict()


def _reraise(exc: BaseException) -> NoReturn:
    """Re-raise ``exc`` (inside its ``except``), as exit 75 when the device cannot go on."""
    from petal.pipeline.reliability.step_guard import device_failure

    failure = device_failure(exc)
    if failure is None:
        raise exc
    raise failure from exc


def say_recall(result: BuildResult) -> None:
    """A published index whose tuning missed the recall target: said on stderr (``recall_warning``)."""
    warning = result.recall_warning()
    if warning is not None:
        say(warning)


def content_fingerprint(store: EmbeddingStore, info: ShardInfo, settings_fp: str, read: ReadConfig | None = None,
                        stats: ReadStats | None = None) -> str:
    """The shard's store fingerprint; its content is read as ``content_sha256`` reads it."""
    return read_retrying(info.path, lambda: store.fingerprint(info, settings_fp), read or ReadConfig(), stats,
                         "cannot read it to fingerprint it")


def content_sha256(store: EmbeddingStore, info: ShardInfo, read: ReadConfig | None = None,
                   stats: ReadStats | None = None) -> str:
    """The shard's sha256 (cached by the store), read as the rows are: an OS read error retried and counted in
    ``stats``, then 74 naming the shard; permission denied 66 (pipeline/ingest/parquet.py ``read_retrying``)."""
    return read_retrying(info.path, lambda: store.content_sha256(info), read or ReadConfig(), stats,
                         "cannot read it to fingerprint it")


def start_weights_hash(spec: ModelSpec) -> WeightsHash:
    try:
        return WeightsHash(spec)
    except OSError as exc:
        raise ConfigError(f"cannot read the model's weights {quote_path(exc.filename or spec.path)}: "
                          f"{exc.strerror or exc}") from exc


def known_weights_sha256(weights: WeightsHash, previous: Manifest | None) -> str | None:
    """The live version's weights sha256 when the weight files' stat is the one it recorded (else ``None``)."""
    if previous is None or not isinstance(previous.model, ModelRecord) or previous.model.weights_stat is None:
        return None
    recorded = tuple(FileStat.from_dict(f) for f in previous.model.weights_stat)
    return weights.recorded(recorded, previous.model.weights_sha256)


def stored_any(store: EmbeddingStore, shards: list[ShardInfo]) -> bool:
    """True when the store holds an entry or committed ranges of any of ``shards`` (with any settings): lookups
    need the fingerprint."""
    return any((store.shards_dir / shard_key(info)).is_dir() or (store.root / "parts" / shard_key(info)).is_dir()
               for info in shards)


class RunIdentity:
    """The run's model identity: the weights' sha256 the settings were built with (``used``; ``None`` until
    the background hash is joined), and everything derived from it."""

    def __init__(self, spec: ModelSpec, config: EngineConfig, job: IndexJob, weights: WeightsHash,
                 used: str | None, previous: Manifest | None = None) -> None:
        self._spec, self._config, self._job, self._weights, self._used = spec, config, job, weights, used
        self._previous = previous
        self._verified = False

    def verify(self) -> None:
        """Join the hash; a sha256 taken from a recorded stat must be what the files hold (else 78)."""
        if not self._verified:
            self._used = self._weights.result() if self._used is None else \
                self._weights.verify(self._used, quote_path(self._spec.path))
            self._verified = True

    @property
    def settled(self) -> bool:
        """The sha256 the settings are built with is known (computed, or taken from a recorded stat)."""
        return self._used is not None

    def spec(self) -> ModelSpec:
        assert self._used is not None, "the weights sha256 is not settled yet"
        return with_weights_sha256(self._spec, self._used)

    def settings(self) -> EmbeddingSettings:
        return embedding_settings(self.spec(), self._config, self._job, self._previous)

    def fingerprints(self, store: EmbeddingStore, shards: list[ShardInfo]) -> list[str]:
        settings_fp = settings_fingerprint(self.settings().to_dict())
        return [store.fingerprint(info, settings_fp) for info in shards]  # content sha256 cached by the store


def bad_row_gate(job: IndexJob, report: RunReport, out: OutputDir) -> BadRowGate | None:
    """The limit on skipped rows: 0 with ``--strict``, the ``--max-bad-rows`` budget, or none."""
    if job.strict:
        return BadRowGate(0, "--strict", report, out.rejects_file)
    if job.max_bad_rows is not None:
        return BadRowGate(job.max_bad_rows.allowed(report.rows["total"]), f"--max-bad-rows {job.max_bad_rows}",
                          report, out.rejects_file)
    return None


def clean_up(out: OutputDir, store: EmbeddingStore, committed: list[StoreEntry], job: IndexJob,
             report: RunReport, stop: StopSignals, published: tuple[str, str | None] | None = None) -> bool:
    """After the live version is settled: drop superseded versions (``published``: the version the run published and
    the live version it started from; by its ``--keep-versions``, and the versions newer than the one it started
    from; ``None``: only what the live version's publish owes still), then the store entries no version left on disk
    uses that are garbage or past ``--keep-unused`` (a kept or leased version stays rebuildable and updatable, an
    unpublished run's work resumable: store/retention.py). A stop signal skips what is left (the next run prunes
    it); the caller ends the run as interrupted. True: every step ran."""
    try:
        if stop.requested:
            return False
        in_use = report.pruned.setdefault("in_use", [])
        was_used = entries_used_now(out, store)  # NOTE: before versions go: the entries of a pruned one are garbage
        if published is not None:
            version, since = published
            report.pruned["versions"] += out.prune_versions(job.keep_versions, in_use, lambda: stop.requested,
                                                            published=version, since=since)
        else:  # NOTE: it pruned by its own --keep-versions, deleting rollback versions without a word while it said
            # "the live version stays" (README: pruning follows a publish); what a publish owes is finished
            report.pruned["versions"] += out.finish_pruning(in_use, lambda: stop.requested)
        if stop.requested:
            return False
        pruned = prune_unused(out, store, {e.path for e in committed}, was_used, job.keep_unused_s,
                              lambda: stop.requested)
        report.pruned.update(store_entries=pruned.store_entries, ranges=pruned.ranges,
                             unused_kept=pruned.unused_kept, unused_pruned=pruned.unused_pruned)
        say_unused(pruned, job.keep_unused_s, say)
        if pruned.stopped:
            return False
        out.rejects_file.unlink(missing_ok=True)  # a refused run's rejects are stale once one succeeds
    except OSError as exc:  # the index is published; what is left is removed by the next run
        path = Path(exc.filename) if exc.filename else out.root  # NOTE: was out.root alone, the path unnamed
        reason = exc.strerror or str(exc)
        say(f"warning: cleaning up {quote_path(out.root)} failed at {quote_path(path)} ({reason}); the next run "
            "retries")
        report.pruned["left"].append({"path": str(path), "reason": reason})
        return False
    return True


def _settle(identity: RunIdentity, store: EmbeddingStore, shards: list[ShardInfo],
            report: RunReport) -> tuple[list[str], dict[str, Any]]:
    """Wait for the weights' sha256 (timed as ``weights_sha256_wait``): the store fingerprints and settings."""
    hashed = time.perf_counter()
    identity.verify()
    report.timings_s["weights_sha256_wait"] = round(time.perf_counter() - hashed, 3)
    return identity.fingerprints(store, shards), identity.settings().to_dict()


def embed_shards(chunks: Prefetcher[TokenizedDocs], shards: list[ShardInfo],
                 fingerprints: list[str] | DeferredIdentity, store: EmbeddingStore, settings: dict[str, Any] | None,
                 engine: Any, transform: OutputTransform,
                 job: IndexJob, report: RunReport, stop: StopSignals, gate: BadRowGate | None,
                 ranges: list[Any] | None = None) -> Generator[tuple[int, StoreEntry], None, None]:
    """Embed the tokenized ``chunks`` of ``shards`` into the store (as ``transform.stored()`` vectors);
    yields ``(position, entry)`` as each commits. ``ranges``: the units the chunks are numbered by (whole shards
    and row-group ranges, store/ranges.py); a commit is then ``(unit, entry or committed range)``."""
    from petal.pipeline.jobs.inflight import InFlight
    from petal.pipeline.reliability.step_guard import StepGuard

    sink = StoreSink(store, shards, fingerprints, settings, transform.dim, transform, ranges)  # transform.stored()
    shard_of = (lambda unit: ranges[unit].position) if ranges is not None else (lambda unit: unit)
    packer = Packer(PackConfig(engine.config.token_budget, engine.config.max_seqs))
    flight = InFlight(engine.config.steps_in_flight)
    guard = StepGuard(engine)  # splits a batch the device has no memory for
    total = sum(r.num_rows for r in ranges) if ranges is not None else sum(s.num_rows for s in shards)
    progress = progress_bar(total, disable=job.quiet, desc="embedding")
    # tokens embedded (results back from the engine): the progress bar's tok/s. NOTE: the report's ``tokens`` are the
    # committed entries' (tally_commit), not these: a shard dropped (a stop, a failure) or a row rejected later is not
    tokens = [0]

    def show_rate() -> None:  # after every result, the flush and the drain included (the bar's last line too)
        progress.set_postfix_str(f"{tokens[0] / max(progress.format_dict['elapsed'], 1e-9):,.0f} tok/s",
                                 refresh=False)

    def step(batch: Any) -> Iterator[tuple[int, StoreEntry]]:
        for done, vectors in flight.push(batch, guard.step(batch)):  # [4] step, [5] result
            yield from sink.add(list(done.keys), vectors, done.seqlens)  # [6] store
            progress.update(done.num_seqs)
            tokens[0] += done.num_tokens
            show_rate()
        fault("after_batch")
        stop.check()  # a batch boundary

    waited = WaitClock()
    failed: list[PetalError] = []  # a read error of a later shard: the shards read before it still commit
    try:
        for chunk in waited.iterate(until_read_error(chunks, failed), stop.interruptible):
            stop.check()
            if gate is not None:
                position = shard_of(chunk.shard_index)
                gate.add(position, str(shards[position].path), chunk.rejects)
            yield from sink.expect(chunk.shard_index, len(chunk.rows), chunk.rejects, chunk.truncated_rows,
                                   chunk.final, chunk.claimed)
            progress.update(len(chunk.rejects))
            for row, doc_id, token_ids in zip(chunk.rows, chunk.ids, chunk.token_ids):
                batch = packer.add((chunk.shard_index, row, doc_id), token_ids)  # [3] pack
                if batch is not None:
                    yield from step(batch)
        last = packer.flush()
        if last is not None:
            yield from step(last)
        for done, vectors in flight.drain():
            yield from sink.add(list(done.keys), vectors, done.seqlens)
            progress.update(done.num_seqs)
            tokens[0] += done.num_tokens
            show_rate()
        if failed:  # the shards wholly read before it are committed by now; the one it spoiled is not (abort)
            raise failed[0]
    except Exception as exc:
        _reraise(exc)
    finally:
        chunks.close()
        sink.abort()  # uncommitted shards are embedded again by the next run
        progress.close()
        report.retries["oom_splits"] += guard.splits
        # where the embed loop blocked: on tokenization (the CPU was behind) or on results (the device was)
        report.timings_s["embed_wait_tokens"] = round(waited.seconds, 3)
        report.timings_s["embed_wait_device"] = round(flight.wait_s, 3)


def until_read_error(chunks: Iterator[TokenizedDocs], failed: list[PetalError]) -> Iterator[TokenizedDocs]:
    """``chunks`` up to a ``PetalError`` raised while reading them (a shard's rows corrupt or unreadable: 65, 74,
    66), which is put in ``failed`` and ends them as their end would: the embed loop then flushes and drains as it
    does at the end, so every shard read whole before the failure is embedded and committed (good data a rerun
    reuses), then raises it. A stop signal (``Interrupted``) and any other exception end the loop at once."""
    try:
        yield from chunks
    except Interrupted:
        raise
    except PetalError as exc:
        failed.append(exc)


class WaitClock:
    """Time spent blocked in ``next()`` of an iterator."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def iterate(self, items: Iterator[Any],
                around: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext) -> Iterator[Any]:
        """``items``; each ``next()`` runs inside ``around()`` (a signal ends the wait at once)."""
        while True:
            started = time.perf_counter()
            try:
                with around():
                    item = next(items)
            except StopIteration:
                return
            finally:
                self.seconds += time.perf_counter() - started
            yield item


def tally_commit(entry: StoreEntry, report: RunReport) -> None:
    """Count a shard this run committed as it commits (a stopped or failed run's report and summary line say the
    rows of the shards it did embed); ``tally_rows`` counts every named shard once the run goes on."""
    report.rows["embedded"] += entry.num_embedded
    report.tokens += entry.num_tokens  # NOTE: the committed rows' only: the same for the same input, however run
    report.rows["truncated"] += entry.num_truncated
    _tally_skipped(entry, report)


def _tally_skipped(entry: StoreEntry, report: RunReport) -> None:
    for reason, count in entry.skipped.items():
        report.skip(reason, count)


def tally_rows(entries: list[StoreEntry], report: RunReport, embedded_now: set[int], kept: list[StoreEntry]) -> None:
    """Rows of the named shards: embedded by this run, reused from the store; skipped, truncated; kept shards' rows."""
    report.rows["embedded"] = sum(e.num_embedded for i, e in enumerate(entries) if i in embedded_now)
    report.tokens = sum(e.num_tokens for i, e in enumerate(entries) if i in embedded_now)
    reused = sum(e.num_embedded for i, e in enumerate(entries) if i not in embedded_now)
    kept_rows = sum(e.num_embedded for e in kept)
    for key, count in (("reused", reused), ("kept", kept_rows)):  # NOTE: only when some: the report's shape
        if count:
            report.rows[key] = count
    report.rows["truncated"] = sum(e.num_truncated for e in entries)
    report.rows["skipped"] = {}
    for entry in entries:
        _tally_skipped(entry, report)


def check_drift(previous: Manifest, settings: EmbeddingSettings | PrecomputedSettings, out: Path) -> None:
    """Refuse to mix vectors made with other settings into an existing index (exit 78), saying in words
    which settings differ."""
    differ = previous.embedding.differences(settings)
    if differ and isinstance(previous.embedding, PrecomputedSettings) != isinstance(settings, PrecomputedSettings):
        # NOTE: every model setting differs then: the list of them buried what did (text vs precomputed vectors)
        was, now = _vectors_kind(previous.embedding), _vectors_kind(settings)
        raise ConfigError(f"{quote_path(out)} holds {was}; this run indexes {now}: one index holds one kind of "
                          "vectors. Index them into another --out, or replace the live version's shards with "
                          "--full --sync --max-removed 100%")
    if differ:
        raise ConfigError(f"{quote_path(out)} was built with other settings ({one_line(', '.join(differ))}); pass "
                          "--full to rebuild it")


def _vectors_kind(settings: EmbeddingSettings | PrecomputedSettings) -> str:
    """What made an index's vectors, in words: a model from text, or a column of precomputed vectors."""
    if isinstance(settings, PrecomputedSettings):
        return f"the precomputed vectors of column {settings.vectors_column!r} ({settings.dim} dimensions)"
    return f"a model's vectors ({settings.architecture}, {settings.dim} dimensions) of text column " \
           f"{settings.text_column!r}"


def unchanged(previous: Manifest, shards: list[ShardInfo], entries: list[StoreEntry], job: IndexJob,
              pending: dict[Path, int] | None = None) -> bool:
    """True when the live version was built from exactly these store entries and index settings; ``pending``:
    the deleted rows of entries whose tombstones this run has planned and not written yet."""
    deleted = pending or {}
    before = [(s.abs_path, s.entry, s.deleted) for s in previous.shards]
    now = [(s.abs_path, e.fingerprint, deleted.get(e.path, tombstoned(e))) for s, e in zip(shards, entries)]
    same_columns = previous.kept_columns == tuple(job.keep_columns)
    return before == now and same_columns and previous.index.settings == job.index


def same_query_prompt(previous: Manifest, spec: ModelSpec) -> bool:
    """Whether the live version records the query prompt this run's model has (``--query-prompt``, else the model's).
    NOTE: no stored vector depends on it (queries only), so ``unchanged`` never looked: a run that changed only the
    prompt was "nothing-to-do ... no setting changed" at exit 0, the flag dropped; it publishes a version now."""
    return not isinstance(previous.model, ModelRecord) or previous.model.query_prompt == spec.prompts.query


def live_before_lookup(out: OutputDir, previous: Manifest | None, shards: list[ShardInfo],
                       fingerprints: list[str] | None, kept: list[ShardRecord], job: IndexJob,
                       delete_ids: DeleteIds | None, report: RunReport, stop: StopSignals | None = None) -> bool | None:
    """The live version checked before any store entry is read, when the run looks to have nothing to publish: the
    live version names these shards with these ``fingerprints`` (and the ``kept`` ones), the same index settings
    and kept columns, and nothing is deleted. True: its files are whole (``nothing_to_publish``'s check, every
    byte), so the entries the run reuses go into no version: only their files whose stat changed since the commit
    are hashed (``lookup(verify=False)``; a nothing-to-do run over a large store read every vector of it). False: it
    was damaged (said; rebuilt from entries checked in full). None: not checked (``published_nothing`` checks it)."""
    if previous is None or fingerprints is None or job.full or delete_ids is not None:
        return None
    recorded = {s.abs_path: s.entry for s in previous.shards}
    if len(recorded) != len(shards) + len(kept) or \
            any(recorded.get(info.abs_path) != fp for info, fp in zip(shards, fingerprints)) or \
            previous.kept_columns != tuple(job.keep_columns) or previous.index.settings != job.index:
        return None
    return nothing_to_publish(out, previous, True, report, stop)


def report_live_version(out: OutputDir, report: RunReport) -> None:
    """A run with nothing to publish reports the live version and its rejects file, as a run that published does
    (NOTE: ``--vectors-column`` runs reported ``rejects_file: null`` then)."""
    report.version = out.current_version()
    assert report.version is not None
    report.rejects_file = str(out.version_dir(report.version) / "rejects.parquet")


def published_nothing(out: OutputDir, previous: Manifest | None, same: bool, report: RunReport,
                      stop: StopSignals | None, live_checked: bool | None, store: EmbeddingStore,
                      named: list[StoreEntry], embedded_now: set[int]) -> bool:
    """``nothing_to_publish``, the live version checked once (``live_before_lookup``). A run that goes on to publish
    after its entries were looked up without the sha256 of their bytes checks them first (``check_bytes``: a damaged
    one is 75, run again): a version is never built from bytes changed since their commit."""
    if live_checked is None:
        return nothing_to_publish(out, previous, same, report, stop)
    if live_checked and same:
        return True
    if live_checked:
        for i, entry in enumerate(named):
            if i not in embedded_now:
                if stop is not None:
                    stop.check()
                store.check_bytes(entry)
    return False


def nothing_to_publish(out: OutputDir, previous: Manifest | None, same: bool, report: RunReport,
                       stop: StopSignals | None = None) -> bool:
    """True when the run has nothing to publish: the live version was built from exactly these store entries and
    settings (``same``) and its files are whole (``live_damage``: every byte against its sha256). A damaged one
    (a file missing, changed, unreadable) is rebuilt from the store, nothing re-embedded: said on stderr and in the
    report (``repaired``), so a rerun never calls a live version that queries cannot open "nothing to do"."""
    if previous is None or not same:
        return False
    # NOTE: read-only, and every byte of a large index: a stop signal ends it at once (Interrupted), not after it
    with stop.interruptible() if stop is not None else contextlib.nullcontext():
        damage = live_damage(out, previous)
    if damage is None:
        return True
    say(f"warning: the live version is damaged ({damage}); publishing a new one built from the store")
    report.repaired = damage
    return False


def shard_records(shards: list[ShardInfo], entries: list[StoreEntry]) -> tuple[ShardRecord, ...]:
    """The manifest's shards: every shard of the version (named or kept) with its store entry and counts."""
    return tuple(ShardRecord(path=str(s.path), abs_path=s.abs_path, size=s.size, mtime_ns=s.mtime_ns,
                             sha256=e.source_sha256, rows=s.num_rows, entry=e.fingerprint, embedded=e.num_embedded,
                             skipped=e.skipped, truncated=e.num_truncated, deleted=tombstoned(e),
                             default_namenode=names_no_namenode(s.abs_path) and not s.namenode_unknown,
                             default_endpoint=names_no_endpoint(s.abs_path) and not s.endpoint_unknown)
                 for s, e in zip(shards, entries))


def make_manifest(version: str, spec: ModelSpec, settings: EmbeddingSettings, job: IndexJob,
                  shards: list[ShardInfo], entries: list[StoreEntry], result: BuildResult,
                  transform: OutputTransform, stored: StoredColumns | None,
                  weights_stat: tuple[FileStat, ...] | None = None) -> Manifest:
    """The version's manifest; ``weights_stat``: the weight files' stat when they were hashed (a later run's
    shortcut to the sha256)."""
    record = ModelRecord.from_spec(spec, None if weights_stat is None else tuple(f.to_dict() for f in weights_stat))
    return Manifest(
        version=version, created_at=Manifest.now(), petal_version=__version__, model=record,
        embedding=settings, columns=ReadRecord(job.read.text_column, job.read.id_column), dim=transform.dim,
        normalize=spec.pooling.normalize, metric=job.index.metric, max_length=spec.pooling.max_length,
        index=result.record(job.index), shards=shard_records(shards, entries),
        counts=version_counts(entries, result.num_vectors), output=transform, stored=stored)


def vector_manifest(version: str, settings: PrecomputedSettings, job: IndexJob, shards: list[ShardInfo],
                    entries: list[StoreEntry], result: BuildResult, transform: OutputTransform,
                    stored: StoredColumns | None) -> Manifest:
    """The manifest of an index of precomputed vectors (``--vectors-column``): no model."""
    return Manifest(
        version=version, created_at=Manifest.now(), petal_version=__version__,
        model=PrecomputedRecord(settings.vectors_column, settings.dim), embedding=settings,
        columns=ReadRecord(job.read.text_column, job.read.id_column, settings.vectors_column), dim=settings.dim,
        normalize=False, metric=job.index.metric, max_length=None, index=result.record(job.index),
        shards=shard_records(shards, entries), counts=version_counts(entries, result.num_vectors), output=transform,
        stored=stored)


def version_counts(entries: list[StoreEntry], num_vectors: int) -> Counts:
    """The manifest's counts: every shard of the version (named or kept), embedded now or earlier."""
    skipped: dict[str, int] = {}
    for entry in entries:
        for reason, count in entry.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + int(count)
    return Counts(rows=sum(e.num_rows for e in entries), embedded=sum(e.num_embedded for e in entries),
                  skipped=skipped, truncated=sum(e.num_truncated for e in entries),
                  vectors=num_vectors, deleted=sum(tombstoned(e) for e in entries))


def guard_removals(out: OutputDir, job: IndexJob, shards: list[ShardInfo], entries: list[StoreEntry],
                   delete_ids: DeleteIds | None, report: RunReport) -> None:
    """``--max-removed``: refuse (65) a version that loses more of the live one's documents than allowed. The live
    version's ids come from its ``ids.parquet``, else from the store entries it was built from, else (both
    unreadable) from its manifest's counts: a damaged live version never lets a run past the guard."""
    if out.current_version() is None:
        return
    previous = live_manifest(out)  # NOTE: None: a malformed live manifest (--full); then only its ids.parquet tells
    store = EmbeddingStore(out.store_dir)
    dropped_shards = report.shard_changes.get("removed", [])
    before = live_version_documents(out, previous, store)
    dropped = dropped_entries(store, previous, shards) if before is not None else None
    removal = None
    if before is not None and dropped is not None:
        try:
            removal = removed_documents(before, entries, delete_ids, dropped, dropped_shards)
        except (OSError, pa.ArrowException):  # a damaged store file: counted from the manifest instead
            removal = None
    if removal is None:
        if previous is None:
            return  # nothing of the live version can be read: nothing to compare
        removal = removed_by_counts(previous, {info.abs_path for info in shards}, dropped_shards)
    report.removed = removal.as_dict()
    check_removal(removal, job.max_removed or RemovalLimit.default(job.sync), job.sync)


def check_delete_ids(delete_ids: DeleteIds, shards: list[ShardInfo], kept: list[ShardRecord]) -> None:
    """Read ``--delete``'s ids as the index's ids will be, before the model loads, where the shards named settle
    it (a shard of string ids, or no shard kept): a value that is not an id of that type is 65 now, not later. No
    shard at all (``--sync`` over sources that hold none) settles nothing, and leaves nothing to delete from."""
    string = any(string_ids(s.id_type) for s in shards)  # no id column: '<shard>:<row>', a string
    if shards and (string or not kept):
        delete_ids.typed(string)


def plan_deletions(out: OutputDir, store: EmbeddingStore, committed: list[StoreEntry], delete_ids: DeleteIds | None,
                   report: RunReport) -> tuple[list[StoreEntry], Deletion | None]:
    """The tombstones the new version is built with: the live version's, carried to the entries of the same shard
    content made with other settings, and none for an entry the live version does not hold its shard at (a deletion
    holds while its shard stays with that content: ``carry_deletions``), then ``--delete``'s (``record_deletion``).
    Returns ``committed`` with the carried rows planned, and what the publish stages and commits (``None``:
    nothing)."""
    try:
        live_exists = out.current_version() is not None
    except ConfigError:
        live_exists = True  # NOTE: a damaged pointer still means a live version whose deletions must hold
    carried = carry_deletions(store, committed, live_manifest(out), live_exists, say)
    committed = carried.apply(committed)
    if delete_ids is None:
        return committed, carried if carried.pending else None
    return committed, record_deletion(out, committed, delete_ids, report).with_carried(carried)


def record_deletion(out: OutputDir, committed: list[StoreEntry], delete_ids: DeleteIds, report: RunReport) -> Deletion:
    """``--delete``: the ids' rows in the new version's entries (tombstones planned, written with the version that
    publishes them: ``Deletion.apply``, ``publish_version``) and the report. An id asked for that the new version's
    shards no longer hold but the live version did leaves with its shard (``--sync`` drops it, or its new content
    lacks it): deleted as asked, not "not in the index"."""
    deletion = apply_deletes(committed, delete_ids)
    if deletion.not_found:
        deletion.gone_with_shards(live_version_ids(out))
    report.rows["deleted"] = deletion.deleted
    report.deletes = {"requested": deletion.requested, "deleted": deletion.deleted,
                      "already_deleted": deletion.already_deleted, "not_found": deletion.not_found,
                      "sample_not_found": deletion.sample_not_found, "rows": deletion.rows}
    if deletion.not_found:
        say(f"warning: --delete: {deletion.not_found} of {deletion.requested} ids are not in the index "
             f"(e.g. {', '.join(map(str, deletion.sample_not_found))})")
    return deletion


def publish_version(out: OutputDir, staging: Path, version: str, deletion: Deletion | None,
                    keep_versions: int, started: StartedFrom) -> None:
    """Make ``staging`` the live version, ``--delete``'s tombstones with it: staged (fsynced) just before, they are
    in force once ``CURRENT`` names this version (pipeline/store/tombstones.py), so a run that dies or fails before
    the swap deleted nothing and one that dies after it keeps the deletion. A failure removes what was staged.
    ``started``: what CURRENT held when the run took the lock; changed since (by hand), nothing is published (75)."""
    try:
        if deletion is not None:
            deletion.stage(version)
        fault("tombstones_staged", out.store_dir / "deleted")
        # the pruning it owes recorded (OutputDir.finish_pruning); CURRENT checked right before the swap
        out.publish(staging, version, keep_versions, started)
    except BaseException:
        if deletion is not None and not _is_live(out, version):
            deletion.discard()
        raise


def _is_live(out: OutputDir, version: str) -> bool:
    try:
        return out.current_version() == version
    except ConfigError:
        return False


def commit_tombstones(out: OutputDir, deletion: Deletion | None) -> bool:
    """After the publish: the staged tombstones become their entries' tombstones. A failure is a warning (they are
    in force as they are; the next run commits them). False then: clean-up must wait (it would prune them)."""
    if deletion is None:
        return True
    try:
        deletion.commit()
    except (OSError, PetalIOError) as exc:
        say(f"warning: committing the tombstones of {quote_path(out.root)} failed ({exc}); the deletion is "
             "published and holds, the next run commits them")
        return False
    return True


class IndexSettingsCheck:
    """The index settings of a run: those asked for (``asked``; ``given``: the fields the caller chose, ``None``:
    all), the live version's elsewhere (``kept_settings``), checked against the output ``kind``, ``dim`` and (an
    upper bound of) ``num_vectors``: a factory given that cannot be built is 2, one kept from the live version 78."""

    def __init__(self, asked: IndexSettings, given: frozenset[str] | None, kind: str, dim: int | None,
                 num_vectors: int) -> None:
        self.asked, self.given, self.kind, self.dim, self.num_vectors = asked, given, kind, dim, num_vectors

    def of(self, job: IndexJob, live: Manifest | None) -> IndexJob:
        """``job`` with the settings kept over ``live`` (``None``: a first run or an unreadable live version: the
        ones asked for, defaults included), checked before any work."""
        settings = kept_settings(live, self.asked, self.given)
        manifest = OutputDir(job.out).version_dir(live.version) / MANIFEST_FILE if live is not None else job.out
        check_kept_factory(settings, self.kind, self.dim, self.num_vectors, self.given, manifest,
                           live=live.index.settings if live is not None else None)
        return replace(job, index=settings)


def live_or_refuse(out: OutputDir) -> Manifest | None:
    """The live manifest an incremental run compares against; damaged: ``ConfigError`` (78) naming it, with
    the way out (``--full`` builds without reading it)."""
    try:
        return out.current_manifest()
    except ConfigError as exc:
        if "--full" in str(exc):
            raise
        raise ConfigError(f"{exc}; the live version is damaged: rebuild with petal index --full") from exc


def peek_live_manifest(out: Path) -> Manifest | None:
    """The live manifest of ``out`` if there is a readable one (no lock; ``None`` otherwise)."""
    try:
        return live_manifest(OutputDir(out))  # NOTE: a malformed one is None here, refused (78) under the lock
    except OSError:  # not a directory, unreadable: the output checks name that
        return None


def live_inputs(live: Manifest | None) -> list[str]:
    """The shards of the live version (an additive run keeps those it does not name: still the user's inputs)."""
    return [record.abs_path for record in live.shards] if live is not None else []


def named_sources(job: IndexJob, live: Manifest | None) -> list[Path | RemotePath]:
    """The shards the SOURCES name now. ``--sync`` over a live version mirrors them as they are: a directory or
    glob that holds no shard names none, and the removal guard judges what the run would drop (65, or an empty
    version when ``--max-removed`` allows it); any other run exits 66 there. A SOURCE that does not exist is 66
    in every run (a typo or a missing mount is not an empty corpus), except an object-store prefix under which the
    live version held shards: a store has no empty directories, so that is an emptied prefix."""
    held = frozenset(record.abs_path for record in live.shards) if live is not None else frozenset()
    named = resolve_sources(job.sources, out=job.out, empty_ok=job.sync and live is not None, held=held)
    older = frozenset() if job.sync else frozenset(record.abs_path for record in live.shards if names_no_endpoint(
        record.abs_path) and not record.default_endpoint) if live is not None else frozenset()
    check_one_spelling(named, frozenset() if job.sync else held, older)
    if not job.sync and live is not None:
        check_no_older_uris(named, frozenset(record.abs_path for record in live.shards
                                             if (names_no_namenode(record.abs_path) and not record.default_namenode)
                                             or names_no_account(record.abs_path)))
    return named


def check_no_older_uris(named: list[Path | RemotePath], unknown: frozenset[str]) -> None:
    """78 when an additive run names, with its namenode (or Azure account), an object the live version holds under
    a URI an older petal stored for it (``older_uris``), its namenode or account unknown (``unknown``: ``hdfs:///...``
    and ``abfs://container/...`` records of an older petal), and no SOURCE of the run names that URI itself
    (``hdfs:///...``: the default namenode's file).

    NOTE: petal stored an HDFS shard without its namenode (``hdfs:///data/x``, which names the default namenode:
    ``remote.stored_root``); named again as ``hdfs://nn1:8020/data/x``, it is another shard to an additive run,
    which kept the old one too. A ``hdfs:///...`` record this petal wrote (``ShardRecord.default_namenode``) is the
    default namenode's: refusing it was a false 78 on an index this petal built (and on the same command again).
    ``--sync`` keeps no shard it does not name."""
    uris = {remote.uri for remote in named if isinstance(remote, RemotePath)}
    for remote in named:
        olders = older_uris(remote) if isinstance(remote, RemotePath) else ()
        older = next((o for o in olders if o in unknown and o not in uris), None)
        if older is None:
            continue
        # NOTE: an older petal stored Azure objects without their account (abfs://container/path): an additive run
        # from another account replaced that shard by its own (and --full could not open it: 74)
        kind, lost, which, again, without, default = (
            ("Azure", "their storage account", "this account's object or another's", "with its account", "an account",
             "")
            if is_azure(older) else
            ("HDFS", "their namenode", "this file or the default namenode's", "under its namenode", "a namenode",
             "; for the default namenode's shards, name the SOURCE without one (hdfs:///...)"))
        raise ConfigError(
            f"{remote} is in the index as {older}: an older petal recorded {kind} shards without {lost}, so petal "
            f"cannot tell whether that is {which}; indexed again {again}, it would be a second shard (its rows twice "
            "in the index, unless the id column makes them replace the old ones). Rerun with --sync naming every "
            f"SOURCE of the index (the shards recorded without {without} are then replaced by those named){default}")


def check_one_spelling(named: list[Path | RemotePath], held: frozenset[str], unknown: frozenset[str]) -> None:
    """78 when a named object's URI differs only in how its namenode is written (``remote.spelled_otherwise``:
    ``hdfs://nn1/x``, ``hdfs://NN1:8020/x``) from another named one's or, in an additive run, a held one's
    (``held``); or, in an additive run, an object-store URI from one an older petal stored (``unknown``: ``s3://b/k``
    of any endpoint, ``gcs://b/k``, ``gs://b/k`` for ``gs://anonymous@b/k``) only in its endpoint
    (``s3+http://h:9000/b/k``), its scheme (``gs://``) or ``anonymous@``.

    NOTE: the URI is the shard's identity: hdfs://nn1/data and then hdfs://nn1:8020/data indexed one file as two
    shards at exit 0 (its rows twice, without an id column). Whether a port left out is 8020 is Hadoop's
    configuration (Arrow passes port 0), which petal cannot read, so it asks for one spelling. Likewise an older
    petal stored every endpoint's object as s3://b/k (and gcs:// apart from gs://): which server's was it? A record
    this petal wrote (``ShardRecord.default_endpoint``) is the default endpoint's, another shard than a SOURCE's
    endpoint's; two SOURCES of one run are two objects."""
    uris = sorted({remote.uri for remote in named if isinstance(remote, RemotePath)})
    by_place: dict[tuple[str, str, str], list[str]] = {}  # (scheme, host, path): the URIs written so
    for uri in [*uris, *sorted(held)]:
        spelling = _place_of(uri)
        if spelling is not None:
            by_place.setdefault(spelling, []).append(uri)
    for uri in uris:
        spelling = _place_of(uri)
        same = by_place.get(spelling, []) if spelling is not None else []
        other = next((o for o in same if spelled_otherwise(uri, o)
                      and (o in unknown or object_spelling(uri) is None)), None)
        if other is not None and object_spelling(uri) is not None:
            raise ConfigError(f"{uri}: the index holds {other}, as an older petal recorded objects: without the "
                              "endpoint a SOURCE named (?endpoint_override, now stored as SCHEME+http://HOST:PORT/"
                              "...), gcs:// apart from gs://, without gs://anonymous@; petal cannot tell whether they "
                              "are one object and would index it twice. Rerun with --sync naming every SOURCE of the "
                              "index (the shards recorded so are then replaced by those named), or name the SOURCE "
                              "as the index holds it")
        if other is not None:
            where = "the index holds" if other in held else "another SOURCE names"
            raise ConfigError(f"{uri}: {where} {other}, which differs only in how the namenode is written (a "
                              "host's case, a port left out): petal cannot tell whether they are one file and "
                              "would index it twice; write the namenode the same way in every SOURCE and every "
                              "run (as the index holds it), or rerun with --sync to replace the shards held")


def _place_of(uri: str) -> tuple[str, str, str] | None:
    """Where a stored URI's file or object is, however its namenode or endpoint is written: ``(scheme, host,
    path)`` for HDFS (``namenode_spelling``), ``(family, "", bucket/key)`` for an object store (``object_spelling``)."""
    spelling = namenode_spelling(uri)
    if spelling is not None:
        return spelling[0], spelling[1], spelling[3]
    place = object_spelling(uri)
    return (place[0], "", place[2]) if place is not None else None


def check_rows_to_index(out: OutputDir, job: IndexJob, committed: list[StoreEntry], report: RunReport) -> None:
    """66 when the new version would hold nothing (every row skipped, or no rows), except a ``--sync`` run over a
    live version whose SOURCES hold no rows at all: it mirrors them, within the removal guard (``guard_removals``:
    65 unless ``--max-removed`` allows dropping every document; then the version it publishes is empty)."""
    if sum(e.num_embedded for e in committed) > 0:
        return
    if job.sync and report.rows["total"] == 0 and out.current_version() is not None:
        return
    raise NoInputError(f"no rows to index: {report.rows['total']} rows read, all skipped "
                       f"({report.rows['skipped'] or 'no rows'})")


def recorded_paths(shards: list[ShardInfo]) -> dict[str, str]:
    """Each shard's path as the version's manifest records it (``shard_records``), by absolute path: what
    ``ids.parquet`` and the rejects name it by, whichever run committed its store entry."""
    return {info.abs_path: str(info.path) for info in shards}


def full_rerun_hint(exc: Interrupted, job: IndexJob) -> Interrupted:
    """A --full run stopped before its publish says to rerun it with --full: a plain rerun does not resume it (it
    ends it, and the next --full embeds everything again)."""
    if not job.full or exc.live_version is not None:
        return exc
    return Interrupted(exc.signum, rerun=FULL_RERUN)


def full_rerun_sources(live: Manifest | None, named: list[ShardInfo], sources: Sequence[str]) -> list[str]:
    """``--full`` in an additive run: the live version's shards not named, to embed again from their files. An object
    is named with the connection options (user info, query string) of a SOURCE in its bucket (``sources``: the
    run's), which its stored URI never holds (``stored_with_options``)."""
    extra = []
    filesystems: dict[str, Any] = {}
    for record in kept_records(live, named, sync=False):
        if names_no_account(record.abs_path):  # NOTE: from_uri refused it (no account): 74, 'rerun ... recovers'
            raise ConfigError(f"--full re-embeds every shard of the index, but {quote_path(record.path)} (kept from an "
                              f"earlier run) was recorded by an older petal as {record.abs_path}, without its Azure "
                              "storage account, so petal cannot open it again; rerun with --sync naming every SOURCE "
                              "of the index (the shards recorded without an account are then replaced by those named)")
        if not _kept_shard_there(record.abs_path, filesystems, sources):
            raise ConfigError(f"--full re-embeds every shard of the index, but {quote_path(record.path)} (kept from an "
                              f"earlier run) is gone{_through_chain(record.abs_path, sources)}; pass --sync to drop "
                              "the shards not named")
        extra.append(stored_with_options(record.abs_path, sources) if is_uri(record.abs_path) else record.abs_path)
    return extra


def _kept_shard_there(abs_path: str, filesystems: dict[str, Any], sources: Sequence[str]) -> bool:
    """Whether a kept shard's file or object (its URI: ``open_stored`` as a SOURCE in its bucket reaches it, one
    client per bucket in ``filesystems``) is there. A storage that fails or refuses is its exit code
    (``storage_error``), never "gone".

    NOTE: an object was not looked at here: one deleted since was listed again as a source and failed 66 'source
    ... does not exist', where a local file gone is 78 with the --sync hint."""
    if not is_uri(abs_path):
        return Path(abs_path).is_file()
    try:
        open_stored(abs_path, filesystems, sources)
    except FileNotFoundError:
        return False
    except (OSError, pa.ArrowException) as exc:  # NOTE: GCS's UNKNOWN status is a bare ArrowException (was 1)
        raise storage_error(f"cannot look up {abs_path}{_through_chain(abs_path, sources)}", exc) from exc
    return True


def _through_chain(abs_path: str, sources: Sequence[str]) -> str:
    """Why a kept object was looked for where it was: said when no SOURCE is in its bucket (``reached_by``), so the
    storage's standard chain chose the endpoint and credentials, not the URI options the run that indexed it had."""
    if not is_uri(abs_path) or reached_by(abs_path, sources) is not None:
        return ""
    spelling = object_spelling(abs_path)
    if spelling is not None and spelling[1]:
        # NOTE: an endpoint's object is looked up there (its stored URI), only its credentials from the chain
        return (f" (looked up at the endpoint it was indexed from, with the credentials of the storage's standard "
                f"chain, as no SOURCE names its bucket there: {chain_of(abs_path)}; or name a SOURCE in its bucket "
                "with its options)")
    # NOTE: this advised S3's variables for a kept gs:// or hdfs:// object too
    where = "namenode" if chain_of(abs_path, CHAIN_ENDPOINT) == CHAIN_ENDPOINT["hdfs"] else \
        "storage account" if is_azure(abs_path) else "bucket"
    return (f" (looked up through the storage's standard chain, as no SOURCE names its {where}: "
            f"{chain_of(abs_path, CHAIN_ENDPOINT)}; or name a SOURCE in its {where} with its options)")
