"""The background stages: ``Prefetcher`` and ``ordered_map`` (order, errors, early close)."""

from __future__ import annotations

import random
import threading
import time

import pytest

from petal.pipeline.ingest.prefetch import Prefetcher, ordered_map


def _slow_square(x: int) -> int:
    time.sleep(random.Random(x).random() * 0.004)  # results finish out of order
    return x * x


@pytest.mark.parametrize("workers", [1, 2, 5])
def test_ordered_map_keeps_input_order(workers):
    assert list(ordered_map(_slow_square, range(60), workers)) == [x * x for x in range(60)]


def test_ordered_map_runs_calls_at_once():
    inside, most = 0, 0
    lock = threading.Lock()
    # NOTE: the first calls wait (10 s at most) until three are inside at once: a bare 10 ms call could end before a
    # loaded machine started the third worker thread, and three at once were never seen
    three = threading.Event()

    def call(x: int) -> int:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
            if inside == 3:
                three.set()
        if not three.wait(10):
            three.set()  # never three at once: the others need not wait too (most < 3 fails below)
        time.sleep(0.01)
        with lock:
            inside -= 1
        return x

    assert list(ordered_map(call, range(12), workers=3)) == list(range(12))
    assert most == 3


def test_ordered_map_source_error_comes_after_earlier_results():
    def source():
        yield from range(5)
        raise OSError("shard 2 unreadable")

    got = []
    with pytest.raises(OSError, match="shard 2 unreadable"):
        for value in ordered_map(_slow_square, source(), workers=3):
            got.append(value)
    assert got == [0, 1, 4, 9, 16]  # everything read before the failure was delivered


def test_ordered_map_function_error_in_its_place():
    def call(x: int) -> int:
        if x == 4:
            raise ValueError("bad batch 4")
        return x

    got = []
    with pytest.raises(ValueError, match="bad batch 4"):
        for value in ordered_map(call, range(10), workers=2):
            got.append(value)
    assert got == [0, 1, 2, 3]


def test_ordered_map_stops_reading_when_closed_early():
    read = []

    def source():
        for x in range(1000):
            read.append(x)
            yield x

    results = ordered_map(_slow_square, source(), workers=2, window=4)
    assert next(results) == 0
    results.close()
    assert len(read) <= 6  # a bounded window ahead, not the whole source


def test_prefetcher_reraises_in_consumer():
    def source():
        yield 1
        raise RuntimeError("producer failed")

    with Prefetcher(source(), depth=2) as items:
        assert next(items) == 1
        with pytest.raises(RuntimeError, match="producer failed"):
            next(items)
