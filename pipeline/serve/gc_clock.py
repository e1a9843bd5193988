"""The process's garbage-collection pauses, for ``/metrics``: a collection stops every thread that needs the
GIL (the event loop, the engine thread's host work), so a long one shows up in every request in flight.

One ``gc.callbacks`` hook per process (collections are the process's, not one server's) times each collection;
``GcCollector`` gives any registry the totals per generation and the longest pause since the server was ready,
and how many objects are frozen out of every collection (``cli/common.py``'s ``freeze_long_lived``).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

GENERATIONS = (0, 1, 2)


class _Clock:
    """Collections, seconds and the longest pause per generation (written by the collecting thread only:
    a collection holds the GIL from its start callback to its stop callback)."""

    def __init__(self) -> None:
        self.collections = [0] * len(GENERATIONS)
        self.seconds = [0.0] * len(GENERATIONS)
        self.longest_s = [0.0] * len(GENERATIONS)
        self._started = 0.0
        self.frozen: int | None = None  # gc.get_freeze_count() when the server became ready (None: counted live)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = int(info.get("generation", 0))
        if not 0 <= generation < len(GENERATIONS) or not self._started:
            return
        paused = time.perf_counter() - self._started
        self._started = 0.0
        self.collections[generation] += 1
        self.seconds[generation] += paused
        self.longest_s[generation] = max(self.longest_s[generation], paused)


_CLOCK = _Clock()
_INSTALLED = threading.Lock()


def restart_longest() -> None:
    """Forget the longest pauses so far (a server that became ready: its load's collections, the deliberate one
    before ``gc.freeze`` among them, are no pause a request met). The counts and totals keep counting; the frozen
    objects are counted now, once (``petal_gc_frozen_objects``).

    NOTE: ``gc.get_freeze_count()`` walks every frozen object (~190k with the packaged MiniLM: 40-50 ms on the 2-core
    machine), holding the GIL: counted at each scrape, every ``/metrics`` stalled the event loop and every request in
    flight that long. Frozen once (``freeze_long_lived``, before the server is ready), they only ever decrease."""
    _CLOCK.longest_s = [0.0] * len(GENERATIONS)
    _CLOCK.frozen = gc.get_freeze_count()


def install() -> None:
    """Start timing collections (idempotent)."""
    with _INSTALLED:
        if _CLOCK not in gc.callbacks:
            gc.callbacks.append(_CLOCK)


class GcCollector(Collector):
    """``petal_gc_collections_total``, ``petal_gc_seconds_total`` and ``petal_gc_longest_pause_seconds`` by
    generation (since the process started timing them: ``install()``; the longest since ``restart_longest()``), and
    ``petal_gc_frozen_objects`` (as counted by ``restart_longest()``)."""

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        count = CounterMetricFamily("petal_gc_collections", "Garbage collections of the process, by generation",
                                    labels=["generation"])
        total = CounterMetricFamily("petal_gc_seconds", "Time the process spent in garbage collections",
                                    labels=["generation"])
        longest = GaugeMetricFamily("petal_gc_longest_pause_seconds",
                                    "The longest garbage collection since the server became ready",
                                    labels=["generation"])
        for g in GENERATIONS:
            count.add_metric([str(g)], _CLOCK.collections[g])
            total.add_metric([str(g)], _CLOCK.seconds[g])
            longest.add_metric([str(g)], _CLOCK.longest_s[g])
        frozen = GaugeMetricFamily("petal_gc_frozen_objects", "Objects no collection walks (gc.freeze: what "
                                   "lives as long as the process)")
        frozen.add_metric([], gc.get_freeze_count() if _CLOCK.frozen is None else _CLOCK.frozen)
        yield count
        yield total
        yield longest
        yield frozen
