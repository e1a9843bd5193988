"""The serve engine thread's spin before it sleeps (``--engine-spin-ms``): bounded, answers right, ends at close.

The real CPU engine with the packaged MiniLM; the engine thread's runnable time (on a CPU or waiting for one) read
from /proc.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette")


def thread_runnable_s(native_id: int) -> float:
    """How long one thread of this process was runnable, in seconds: on a CPU or waiting in a run queue for one
    (/proc's schedstat, in ns). A spinning thread is runnable all along; a thread asleep (a condition wait) is not.
    NOTE: not its CPU time: a thread that spins with sched_yield gets almost no CPU while a loaded machine has other
    runnable processes (CFS passes over a yielder), and showed no CPU time at all beside two busy loops."""
    on_cpu, waiting, _ = Path(f"/proc/self/task/{native_id}/schedstat").read_text().split()
    return (int(on_cpu) + int(waiting)) / 1e9


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


@pytest.mark.skipif(not Path("/proc/self/schedstat").is_file(), reason="reads thread run times from /proc")
def test_a_spinning_engine_thread_answers_right_and_stops_spinning(model):
    """Requests spaced inside and outside the spin window get the same vectors as the engine; once idle the
    thread spins at most its window, then sleeps (no longer runnable); close() ends it while it spins."""
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
        start = thread_runnable_s(tid)
        time.sleep(spin_ms / 2000)
        assert thread_runnable_s(tid) - start >= 0.05, "the engine thread slept at once: no spin"
        time.sleep(spin_ms / 1000 + 0.2)  # the last spin is over
        before = thread_runnable_s(tid)
        time.sleep(1.0)
        # NOTE: a thread spinning is runnable all along (~1.0 s here, however loaded the machine); one asleep ~0,
        # but a loaded machine's run queue may add a little to any wake-up: half the window between the two
        assert thread_runnable_s(tid) - before < 0.5, "the engine thread kept spinning past --engine-spin-ms"

        asyncio.run(ask("one more"))  # a spin starts again after this answer ...
    finally:
        closed_at = time.perf_counter()
        assert batcher.close(timeout_s=5.0)  # ... and close() ends it without waiting the window out
    assert time.perf_counter() - closed_at < 5.0
