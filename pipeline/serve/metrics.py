"""Prometheus metrics of one server (its own registry, so several servers can live in one process)."""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from petal.pipeline.serve import gc_clock

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class ServeMetrics:
    """Counters and histograms named ``petal_*``; ``render()`` is the ``/metrics`` body."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("petal_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.request_seconds = Histogram("petal_request_seconds", "Request latency by route and status (handler start "
                                         "to answer; a request the HTTP layer answers or drops itself: from its first "
                                         "byte)", ["route", "status"], buckets=LATENCY_BUCKETS_S, registry=r)
        self._counted: dict[tuple[str, int], tuple[Any, Any]] = {}  # (route, status) -> its labelled children
        self.queue_seconds = Histogram("petal_queue_seconds", "Time a text waited for its engine step",
                                       buckets=LATENCY_BUCKETS_S, registry=r)
        self.batch_tokens = Histogram("petal_batch_tokens", "Tokens per engine step", buckets=TOKEN_BUCKETS,
                                      registry=r)
        self.batch_texts = Histogram("petal_batch_texts", "Texts per engine step",
                                     buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=r)
        self.step_seconds = Histogram("petal_step_seconds", "Engine step, launch to result on the host",
                                      buckets=LATENCY_BUCKETS_S, registry=r)
        self.graph_replays = Counter("petal_graph_replays", "CUDA-graph replays of the engine", registry=r)
        self.queue_texts = Gauge("petal_queue_texts", "Texts waiting for the engine", registry=r)
        self.body_bytes = Gauge("petal_body_bytes", "Request body bytes held by requests in flight, a "
                                "parsed body's when more (--max-body-bytes-in-flight)", registry=r)
        self.answer_bytes = Gauge("petal_answer_bytes", "Answer bytes of /search and /v1/embeddings held until "
                                  "their client has taken them (--max-answer-bytes-in-flight)", registry=r)
        self.overloaded = Counter("petal_overloaded", "Requests refused with 503 (queue full)", registry=r)
        self.index_version = Gauge("petal_index_version", "1 for the index version being served", ["version"],
                                   registry=r)
        self.index_vectors = Gauge("petal_index_vectors", "Vectors in the served index", registry=r)
        self.index_reloads = Counter("petal_index_reloads", "Index versions loaded after start, by result",
                                     ["result"], registry=r)
        self.index_refused = Gauge("petal_index_refused", "1 for a published version the server refused, by reason",
                                   ["version", "reason"], registry=r)
        self.search_copy = Gauge("petal_search_copy", "1 for how the served version is searched: device (cpu: FAISS), "
                                 "copy (lists, exact, none) and the GPU copy's dtype",
                                 ["version", "device", "copy", "dtype"], registry=r)
        # NOTE: a version is swapped in on the follower's thread while /metrics renders on the event loop: a scrape
        # between a gauge's clear() and its set() saw no petal_index_version at all, or the new version beside the
        # old petal_index_vectors; the series of the version served change and are read under this lock
        self._swap = threading.RLock()
        gc_clock.install()  # NOTE: the process's collections (one hook however many servers)
        r.register(gc_clock.GcCollector())

    def count(self, route: str, status: int, seconds: float) -> None:
        """One request, answered or not (444, 499), counted in ``petal_requests_total`` and its time observed in
        ``petal_request_seconds`` under the same route and status. NOTE: every request is counted here, so the two
        agree by route and status; before, what the HTTP layer answered or dropped itself (a parser's 400, a 431, a
        444 behind a closing answer) was counted with no latency at all. Routes and statuses are a few fixed labels."""
        children = self._counted.get((route, status))
        if children is None:
            children = self._counted[route, status] = (
                self.requests.labels(route=route, status=str(status)),
                self.request_seconds.labels(route=route, status=str(status)))
        children[0].inc()
        children[1].observe(seconds)

    def serving(self, version: str, vectors: int) -> None:
        """``version`` (of ``vectors`` vectors) is served now: a refusal before it is over."""
        with self._swap:
            self.index_refused.clear()
            self.index_version.clear()
            self.index_version.labels(version=version).set(1)
            self.index_vectors.set(vectors)

    def refused(self, version: str, reason: str) -> None:
        with self._swap:
            self.index_refused.clear()
            self.index_refused.labels(version=version, reason=reason).set(1)

    def searching(self, version: str, device: str, copy: str, dtype: str) -> None:
        with self._swap:
            self.search_copy.clear()
            self.search_copy.labels(version=version, device=device, copy=copy, dtype=dtype).set(1)

    def render(self) -> bytes:
        with self._swap:
            return generate_latest(self.registry)

    def swapping(self) -> threading.RLock:
        """Held around a version swap (the live version and its gauges set together) and around a scrape that sets
        ``petal_search_copy`` from the live version and renders: no scrape sees one version's series beside the
        other's."""
        return self._swap
