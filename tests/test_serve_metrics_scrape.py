"""``/metrics`` renders without walking the objects frozen out of garbage collection: ``gc.get_freeze_count()`` walks
every one of them holding the GIL (~190k with the packaged MiniLM: 40-50 ms a scrape on the 2-core machine), so each
scrape stalled the event loop and every request in flight. The count is taken once, when the server becomes ready
(after ``freeze_long_lived``)."""

from __future__ import annotations

import gc
import re
import time

import pytest

pytest.importorskip("prometheus_client")


def test_a_scrape_does_not_walk_the_frozen_objects():
    from petal.pipeline.serve import gc_clock
    from petal.pipeline.serve.metrics import ServeMetrics

    metrics = ServeMetrics()
    lived = [[i] for i in range(1_000_000)]  # what a loaded server freezes (libraries, the model): here, more of it
    gc.collect()
    gc.freeze()
    try:
        gc_clock.restart_longest()  # the server became ready (after freeze_long_lived)
        started = time.perf_counter()
        frozen = gc.get_freeze_count()
        walk_s = time.perf_counter() - started
        assert frozen >= len(lived)
        scrapes = []
        for _ in range(5):
            started = time.perf_counter()
            text = metrics.render().decode()
            scrapes.append(time.perf_counter() - started)
        said = re.search(r"^petal_gc_frozen_objects (\S+)$", text, re.M)
        assert said, text
        # NOTE: the count said is the one taken when the server became ready; frozen objects only ever go (a thread
        # left by an earlier test may free a few between that count and this walk), never come back
        assert frozen <= float(said.group(1)) <= frozen + 1000, (said.group(1), frozen)
        # NOTE: a render is ~1 ms; a walk of a million objects tens of ms (before: every render walked them)
        assert min(scrapes) < walk_s / 4, (scrapes, walk_s)
    finally:
        gc.unfreeze()
        del lived
        gc_clock.restart_longest()  # counted again: nothing frozen now
