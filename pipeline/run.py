"""``petal index``, top to bottom: read -> tokenize -> pack -> step -> result -> store -> index.

Every check that can fail on the user's input or settings runs before the model loads. Shards
already embedded with the same content and settings are reused from the store; the index is
always built from the store and published as a new version by one atomic pointer swap.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from engine.config import EngineConfig
from engine.engine import Engine, resolve_device, resolve_dtype
from engine.loader import ModelError, ModelSpec, inspect_model
from pipeline import __version__
from pipeline.config import IndexJob, default_token_budget
from pipeline.documents import read_documents
from pipeline.errors import BadInputError, ConfigError, Interrupted, NoInputError
from pipeline.fsutil import write_json_atomic
from pipeline.index_writer import build_index
from pipeline.inflight import InFlight
from pipeline.layout import OutputDir
from pipeline.pack import PackConfig, Packer
from pipeline.parquet import ShardInfo, preflight, resolve_sources
from pipeline.prefetch import Prefetcher
from pipeline.report import RunReport
from pipeline.shard_changes import shard_changes
from pipeline.signals import StopSignals
from pipeline.store import EmbeddingStore, StoreEntry, StoreSink, settings_fingerprint
from pipeline.tokens import TextTokenizer, tokenize_documents

EngineFactory = Callable[[ModelSpec, EngineConfig], Engine]
KEEP_VERSIONS = 2  # the live version and the one before it (rollback)


def model_spec(model: str | None, max_length: int | None) -> ModelSpec:
    """The model's configuration (no weights); a missing or unsafe model is a ``ConfigError`` (78)."""
    try:
        return inspect_model(model, max_length=max_length)
    except ModelError as exc:
        raise ConfigError(str(exc)) from exc


def engine_config(job: IndexJob, spec: ModelSpec) -> EngineConfig:
    device = resolve_device(job.device)
    budget = job.token_budget or default_token_budget(device, spec.pooling.max_length)
    if budget < spec.pooling.max_length:
        raise ValueError(f"token budget {budget} < max length {spec.pooling.max_length}: "
                         "raise --token-budget or lower --max-length")
    return EngineConfig(device=device, dtype=resolve_dtype(job.dtype, device), attention=job.attention,  # type: ignore[arg-type]
                        cuda_graphs=job.cuda_graphs, token_budget=budget, max_seqs=job.max_seqs)


def embedding_settings(spec: ModelSpec, config: EngineConfig, job: IndexJob) -> dict[str, Any]:
    """Everything that shapes a shard's vectors (the store fingerprint; drift is checked on it)."""
    return {
        "architecture": spec.config.architecture,
        "weights_sha256": spec.weights_sha256,
        "tokenizer_sha256": spec.tokenizer_sha256,
        "pooling": spec.pooling.mode,
        "normalize": spec.pooling.normalize,
        "max_length": spec.pooling.max_length,
        "dim": spec.dim,
        "dtype": config.dtype,
        "text_column": job.read.text_column,
        "id_column": job.read.id_column,
    }


def run_index(job: IndexJob, report: RunReport, engine_factory: EngineFactory = Engine) -> RunReport:
    """Index ``job.sources`` into ``job.out``. Raises ``PetalError`` subclasses for the user's mistakes."""
    started = time.perf_counter()
    # [0] preflight: every footer and schema, the model's files, the output directory
    shards = preflight(resolve_sources(job.sources), job.read)
    report.shards["total"] = len(shards)
    report.rows["total"] = sum(s.num_rows for s in shards)
    spec = model_spec(job.model, job.max_length)
    config = engine_config(job, spec)
    settings = embedding_settings(spec, config, job)
    report.model = spec.describe()
    out = OutputDir(job.out)
    out.prepare()
    report.out = str(out.root)
    report.timings_s["preflight"] = round(time.perf_counter() - started, 3)

    with out.lock(), StopSignals() as stop:
        out.clean_staging()
        previous = out.current_manifest()
        if previous is not None and not job.full:
            check_drift(previous, settings, out.root)
        store = EmbeddingStore(out.store_dir)
        store.open()
        settings_fp = settings_fingerprint(settings)
        fingerprints = [store.fingerprint(info, settings_fp) for info in shards]
        report.shard_changes = shard_changes(previous, shards, [store.content_sha256(info) for info in shards])
        entries: list[StoreEntry | None] = [None if job.full else store.lookup(info, fp)
                                            for info, fp in zip(shards, fingerprints)]
        todo = [i for i, entry in enumerate(entries) if entry is None]
        report.shards["reused"] = len(shards) - len(todo)

        if todo:
            engine = engine_factory(spec, config)
            report.engine = engine.describe()
            report.timings_s["model_load"] = round(engine.stats.model_load_s, 3)
            tokenizer = TextTokenizer(spec.tokenizer_file, spec.pooling.max_length)
            embed_started = time.perf_counter()
            todo_shards = [shards[i] for i in todo]
            for position, entry in embed_shards(todo_shards, [fingerprints[i] for i in todo], store, settings,
                                                engine, tokenizer, job, report, stop):
                entries[todo[position]] = entry
                report.shards["embedded"] += 1
            report.timings_s["embed"] = round(time.perf_counter() - embed_started, 3)
            report.engine["stats"] = engine.stats.as_dict()

        committed = [e for e in entries if e is not None]
        assert len(committed) == len(shards)
        tally_rows(committed, report)
        if job.strict and report.rows["skipped"]:
            raise BadInputError(f"bad rows with --strict: {report.rows['skipped']} (see the store's rejects)")
        if report.rows["embedded"] == 0:
            raise NoInputError(f"no rows to index: {report.rows['total']} rows read, all skipped "
                               f"({report.rows['skipped'] or 'no rows'})")
        if previous is not None and not job.full and unchanged(previous, shards, committed, job):
            report.version = out.current_version()
            report.finish("nothing-to-do", 0, "no shard or setting changed; the live version stays")
            return report

        # [7] index: built from the store, written beside the live version, published atomically
        index_started = time.perf_counter()
        staging = out.staging_dir()
        result = build_index(committed, spec.dim, job.index, staging)
        write_rejects(committed, staging / "rejects.parquet")
        version = out.new_version_id()
        manifest = make_manifest(version, spec, settings, job, shards, committed, result, report)
        write_json_atomic(staging / "manifest.json", manifest)
        out.publish(staging, version)
        report.timings_s["index"] = round(time.perf_counter() - index_started, 3)
        report.version = version
        report.index = {"factory": result.factory, "metric": result.metric, "num_vectors": result.num_vectors,
                        "superseded": result.superseded, "search_params": result.search_params,
                        "tuning": result.tuning, "storage": result.plan.get("storage", "memory"),
                        "device": result.device}
        report.rejects_file = str(out.version_dir(version) / "rejects.parquet")
        store.prune({e.path for e in committed})
        out.prune_versions(KEEP_VERSIONS)
    report.finish("success", 0)
    return report


def embed_shards(shards: list[ShardInfo], fingerprints: list[str], store: EmbeddingStore,
                 settings: dict[str, Any], engine: Engine, tokenizer: TextTokenizer, job: IndexJob,
                 report: RunReport, stop: StopSignals) -> Iterator[tuple[int, StoreEntry]]:
    """Embed ``shards`` into the store; yields ``(position in shards, entry)`` as each commits."""
    sink = StoreSink(store, shards, fingerprints, settings, engine.dim)
    packer = Packer(PackConfig(engine.config.token_budget, engine.config.max_seqs))
    flight = InFlight(engine.config.steps_in_flight)
    documents = read_documents(shards, job.read)  # [1] read (streamed)
    chunks = Prefetcher(tokenize_documents(documents, tokenizer), depth=8)  # [2] tokenize, in the background
    progress = tqdm(total=sum(s.num_rows for s in shards), unit="doc", file=sys.stderr, disable=job.quiet,
                    desc="embedding", dynamic_ncols=True, mininterval=0.5)
    tokens = 0
    try:
        for chunk in chunks:
            if stop.requested:
                break
            if job.strict and chunk.rejects:
                row, reason = chunk.rejects[0]
                raise BadInputError(f"{shards[chunk.shard_index].path}: row {row}: {reason} (--strict)")
            yield from sink.expect(chunk.shard_index, len(chunk.rows), chunk.rejects, len(chunk.truncated_rows),
                                   chunk.final)
            progress.update(len(chunk.rejects))
            for row, doc_id, token_ids in zip(chunk.rows, chunk.ids, chunk.token_ids):
                tokens += len(token_ids)
                batch = packer.add((chunk.shard_index, row, doc_id), token_ids)  # [3] pack
                if batch is None:
                    continue
                for done, vectors in flight.push(batch, engine.step(batch)):  # [4] step, [5] result
                    yield from sink.add(list(done.keys), vectors)  # [6] store
                    progress.update(done.num_seqs)
            progress.set_postfix_str(f"{tokens / max(progress.format_dict['elapsed'], 1e-9):,.0f} tok/s",
                                     refresh=False)
        last = None if stop.requested else packer.flush()
        if last is not None:
            for done, vectors in flight.push(last, engine.step(last)):
                yield from sink.add(list(done.keys), vectors)
                progress.update(done.num_seqs)
        for done, vectors in flight.drain():
            yield from sink.add(list(done.keys), vectors)
            progress.update(done.num_seqs)
    finally:
        chunks.close()
        sink.abort()  # uncommitted shards are embedded again by the next run
        progress.close()
        report.tokens += tokens
    if stop.requested:
        assert stop.signum is not None
        raise Interrupted(stop.signum)


def tally_rows(entries: list[StoreEntry], report: RunReport) -> None:
    report.rows["embedded"] = sum(e.num_embedded for e in entries)
    report.rows["truncated"] = sum(int(e.meta["counts"]["truncated"]) for e in entries)
    report.rows["skipped"] = {}
    for entry in entries:
        for reason, count in entry.meta["counts"]["skipped"].items():
            report.skip(reason, int(count))


def check_drift(previous: dict[str, Any], settings: dict[str, Any], out: Path) -> None:
    """Refuse to mix vectors made with other settings into an existing index (exit 78)."""
    before = previous.get("embedding", {})
    differ = sorted(k for k in set(before) | set(settings) if before.get(k) != settings.get(k))
    if differ:
        details = ", ".join(f"{k}: {before.get(k)!r} -> {settings.get(k)!r}" for k in differ)
        raise ConfigError(f"{out} was built with other settings ({details}); pass --full to rebuild it")


def unchanged(previous: dict[str, Any], shards: list[ShardInfo], entries: list[StoreEntry], job: IndexJob) -> bool:
    """True when the live version was built from exactly these store entries and index settings."""
    before = [(s["abs_path"], s["entry"]) for s in previous.get("shards", [])]
    now = [(s.abs_path, e.fingerprint) for s, e in zip(shards, entries)]
    return before == now and previous.get("index", {}).get("settings") == job.index.as_dict()


def write_rejects(entries: list[StoreEntry], path: Path) -> None:
    """Every skipped row of the indexed shards: shard, row, reason."""
    tables = []
    for entry in entries:
        rejects = entry.rejects()
        if rejects.num_rows:
            shard = pa.array([entry.meta["source"]["path"]] * rejects.num_rows, pa.string())
            tables.append(pa.table({"shard": shard, "row": rejects.column("row"), "reason": rejects.column("reason")}))
    schema = pa.schema([("shard", pa.string()), ("row", pa.int64()), ("reason", pa.string())])
    pq.write_table(pa.concat_tables(tables) if tables else schema.empty_table(), path)


def make_manifest(version: str, spec: ModelSpec, settings: dict[str, Any], job: IndexJob, shards: list[ShardInfo],
                  entries: list[StoreEntry], result: Any, report: RunReport) -> dict[str, Any]:
    return {
        "format": 1,
        "petal_version": __version__,
        "version": version,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": spec.describe(),
        "embedding": settings,
        "read": {"text_column": job.read.text_column, "id_column": job.read.id_column},
        "dim": spec.dim,
        "normalize": spec.pooling.normalize,
        "metric": job.index.metric,
        "max_length": spec.pooling.max_length,
        "index": result.manifest(job.index),
        "shards": [
            {"path": str(s.path), "abs_path": s.abs_path, "size": s.size, "mtime_ns": s.mtime_ns,
             "sha256": e.meta["source"]["sha256"], "rows": s.num_rows, "entry": e.fingerprint, **e.meta["counts"]}
            for s, e in zip(shards, entries)
        ],
        "counts": {"rows": report.rows["total"], "embedded": report.rows["embedded"],
                   "skipped": report.rows["skipped"], "truncated": report.rows["truncated"],
                   "vectors": result.num_vectors},
    }
