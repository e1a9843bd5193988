"""The serve engine thread's spin before it sleeps (``--engine-spin-ms``): bounded, answers right, ends at close.

The real CPU engine with the packaged MiniLM; the engine thread's CPU time read from /proc.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette")


def thread_cpu_s(native_id: int) -> float:
    """utime + stime of one thread of this process, in seconds."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def model(minilm_spec):
    from petal.pipeline.jobs.query import QueryModel, engine_config

    return QueryModel(minilm_spec, engine_config(minilm_spec, "cpu"))


def batcher_for(model, spin_ms):
    from petal.pipeline.serve.batcher import TokenBatcher
    from petal.pipeline.serve.metrics import ServeMetrics

    return TokenBatcher(model.engine, ServeMetrics(), tokenizers=dict(model.tokenizers), spin_ms=spin_ms)


def test_default_spin_is_off_on_the_cpu_and_negative_is_refused(model):
    from petal.pipeline.serve.settings import ServeSettings

    assert batcher_for(model, None).spin_s == 0.0  # the CPU engine needs its cores
    assert batcher_for(model, 3.0).spin_s == pytest.approx(0.003)
    with pytest.raises(ValueError, match="--engine-spin-ms"):
        batcher_for(model, -1.0)
    with pytest.raises(ValueError, match="--engine-spin-ms"):
        ServeSettings(engine_spin_ms=-0.5)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread CPU time from /proc")
def test_a_spinning_engine_thread_answers_right_and_stops_spinning(model):
    """Requests spaced inside and outside the spin window get the same vectors as the engine; once idle the
    thread spins at most its window, then sleeps (its CPU time stops growing); close() ends it while it spins."""
    # NOTE: /proc counts CPU time in clock ticks (10 ms): the window is long enough that a thread sharing a
    # busy 2-core machine still shows several ticks of spin in half of it
    spin_ms = 400.0
    batcher = batcher_for(model, spin_ms)
    batcher.start()
    texts = ["how do glaciers move", "espresso", "the history of rome"]
    try:
        async def ask(text: str) -> np.ndarray:
            return (await batcher.embed_texts((text,), "query", False)).rows

        got = []
        for gap_s in (0.0, 0.02, 0.5):  # within the window, within it, after it (the thread asleep)
            time.sleep(gap_s)
            got.append(asyncio.run(ask(texts[len(got)])))
        np.testing.assert_allclose(np.concatenate(got), model.embed(texts), atol=1e-5)

        tid = batcher._thread.native_id
        asyncio.run(ask("again"))
        start = thread_cpu_s(tid)
        time.sleep(spin_ms / 1000)  # the whole window: on a loaded machine the spinning thread gets a share of it
        assert thread_cpu_s(tid) - start >= 0.03, "the engine thread slept at once: no spin"
        time.sleep(spin_ms / 2000)  # the last spin is over
        before = thread_cpu_s(tid)
        time.sleep(0.6)
        assert thread_cpu_s(tid) - before < 0.1, "the engine thread kept spinning past --engine-spin-ms"

        asyncio.run(ask("one more"))  # a spin starts again after this answer ...
    finally:
        closed_at = time.perf_counter()
        assert batcher.close(timeout_s=5.0)  # ... and close() ends it without waiting the window out
    assert time.perf_counter() - closed_at < 5.0
