"""The embed phase scaled out: worker processes on one host (``--devices``/``--workers``) or Ray (``--ray``).

Either way the work is handed out as units, whole shards and row-group ranges of large shards
(pipeline/store/ranges.py); each unit is embedded by exactly one worker and committed to the store on
its own (a shard's entry, or a range's part); this process receives the commits, assembles a split
shard's entry once its last range commits and, after the last, builds and publishes the index
(pipeline/jobs/index_run.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from petal.pipeline.config import IndexJob
from petal.pipeline.ingest.parquet import ReadStats, ShardInfo
from petal.pipeline.jobs.report import RunReport
from petal.pipeline.jobs.worker import WorkerPlan
from petal.pipeline.reliability.errors import (
    EXIT_CANTCREAT,
    EXIT_CONFIG,
    EXIT_DATAERR,
    EXIT_INTERNAL,
    EXIT_IOERR,
    EXIT_NOINPUT,
    EXIT_SIGNAL_BASE,
    EXIT_TEMPFAIL,
    EXIT_USAGE,
)
from petal.pipeline.reliability.signals import StopSignals
from petal.pipeline.store.embeddings import EmbeddingStore, StoreEntry
from petal.pipeline.store.ranges import RangeAssembly, plan_ranges


def embed_scaled(job: IndexJob, shards: list[ShardInfo], fingerprints: list[str], store: EmbeddingStore,
                 settings: dict[str, Any], spec: Any, config: Any, engine_factory: Callable[..., Any],
                 transform: Any, report: RunReport, stop: StopSignals,
                 reads: ReadStats) -> Iterator[tuple[int, StoreEntry]]:
    """Embed ``shards`` as ``job.scale`` says; yields ``(position, entry)`` as each shard commits."""
    assert job.scale is not None
    spec.weights_sha256, spec.tokenizer_sha256  # noqa: B018  (computed once here, pickled to every worker)
    # large shards: row-group ranges; --full embeds every row again (committed ranges are not reused, but for those
    # of the stopped --full run it resumes)
    units = plan_ranges(store, shards, fingerprints, job.scale.split_rows, job.read, reads, full=job.full)
    assembly = RangeAssembly(store, shards, fingerprints, settings, transform.dim, units)
    plan = WorkerPlan(job=job, spec=spec, config=config, transform=transform, engine_factory=engine_factory,
                      settings=settings, store_root=store.root, shards=shards, fingerprints=fingerprints,
                      sha256=[store.content_sha256(info) for info in shards], ranges=units.ranges)
    if not units.ranges:  # every range of every shard was committed by an earlier run: only assembly is left
        commits: Iterator[tuple[int, StoreEntry]] = iter(assembly.ready())
    elif job.scale.ray:
        from petal.pipeline.jobs.ray_embed import embed_on_ray

        commits = embed_on_ray(plan, job.scale, report, stop, reads, assembly)
    else:
        from petal.pipeline.jobs.workers import embed_in_pool, worker_slots

        commits = embed_in_pool(plan, worker_slots(job.scale, config.device, len(units.ranges)), report, stop, reads,
                                assembly)
    return _with_ranges_report(commits, assembly, report, job.scale.split_rows)


def _with_ranges_report(commits: Iterator[tuple[int, StoreEntry]], assembly: RangeAssembly, report: RunReport,
                        split_rows: int) -> Iterator[tuple[int, StoreEntry]]:
    """``commits``; the report's ``ranges`` (which ranges this run embedded, which it reused) however they end."""
    try:
        yield from commits
    finally:
        if assembly.plan.split:
            report.ranges = assembly.report(split_rows)



_CHANGED = " (all of it again if the fix changes the model or an embedding setting)"
# what cures the failure of a worker (or Ray actor) that ended with this exit code, before a rerun embeds only what is
# missing (the store keeps every shard and range committed), and what else to know; a retry alone cures only 75
_CURES: dict[int, tuple[str, str]] = {
    EXIT_DATAERR: ("once the input is fixed", ""),
    EXIT_NOINPUT: ("once the input is fixed", ""),
    EXIT_CANTCREAT: ("once petal may write the output", ""),
    EXIT_IOERR: ("once the storage (or the host's memory) recovers", ""),
    EXIT_CONFIG: ("once the configuration is fixed", _CHANGED),
    EXIT_USAGE: ("once the flags are fixed", _CHANGED),
}


def rerun_advice(exit_code: int, kept: bool) -> str:
    """What a rerun does after a scaled run failed with ``exit_code``; ``kept``: the store holds some of its shards."""
    if exit_code == EXIT_TEMPFAIL:
        return "rerun to embed only what is missing"
    if exit_code > EXIT_SIGNAL_BASE:  # a worker stopped by a signal of its own: as an interrupted run says
        return "rerun to resume"
    if exit_code == EXIT_INTERNAL:
        reuse = "reuses the committed ones but " if kept else ""
        return f"this is a bug in petal (the traceback is above): a rerun {reuse}may fail the same way"
    cure, caveat = _CURES.get(exit_code, ("once the cause is fixed", ""))
    return f"{'the committed ones are kept: ' if kept else ''}{cure}, a rerun embeds only what is missing{caveat}"


def unfinished(report: RunReport, committed: int, exit_code: int, units: str = "") -> str:
    """The end of a failed scaled run's message: ``N of M shards committed{units}, K not: <rerun_advice>``. M: the
    run's shards (``report.shards["total"]``, the summary line's); N: what the store holds of them, which a rerun
    reuses: those reused (and kept) from earlier runs (``report.shards["reused"]``) and the ``committed`` shard entries
    this run made (embedded, or assembled from ranges an earlier run committed)."""
    total = report.shards["total"]
    held = report.shards["reused"] + committed
    return f"{held} of {total} shards committed{units}, {total - held} not: {rerun_advice(exit_code, held > 0)}"
