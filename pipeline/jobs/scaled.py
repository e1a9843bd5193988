"""The embed phase scaled out: worker processes on one host (``--devices``/``--workers``) or Ray (``--ray``).

Either way each shard is embedded by exactly one worker and committed to the store with the
single-process run's per-shard commit; this process receives the commits and, after the last,
builds and publishes the index (pipeline/jobs/index_run.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from petal.pipeline.config import IndexJob
from petal.pipeline.ingest.parquet import ReadStats, ShardInfo
from petal.pipeline.jobs.report import RunReport
from petal.pipeline.jobs.worker import WorkerPlan
from petal.pipeline.reliability.signals import StopSignals
from petal.pipeline.store.embeddings import EmbeddingStore, StoreEntry


def embed_scaled(job: IndexJob, shards: list[ShardInfo], fingerprints: list[str], store: EmbeddingStore,
                 settings: dict[str, Any], spec: Any, config: Any, engine_factory: Callable[..., Any],
                 transform: Any, report: RunReport, stop: StopSignals,
                 reads: ReadStats) -> Iterator[tuple[int, StoreEntry]]:
    """Embed ``shards`` as ``job.scale`` says; yields ``(position, entry)`` as each shard commits."""
    assert job.scale is not None
    spec.weights_sha256, spec.tokenizer_sha256  # noqa: B018  (computed once here, pickled to every worker)
    plan = WorkerPlan(job=job, spec=spec, config=config, transform=transform, engine_factory=engine_factory,
                      settings=settings, store_root=store.root, shards=shards, fingerprints=fingerprints,
                      sha256=[store.content_sha256(info) for info in shards])
    if job.scale.ray:
        from petal.pipeline.jobs.ray_embed import embed_on_ray

        return embed_on_ray(plan, job.scale, report, stop, reads)
    from petal.pipeline.jobs.workers import embed_in_pool, worker_slots

    return embed_in_pool(plan, worker_slots(job.scale, config.device), report, stop, reads)
