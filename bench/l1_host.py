"""Host-side cost of one small step (L1): where the microseconds go outside the GPU.

    python3 bench/l1_host.py SHAPE NUM_TOKENS [--profile]     (on the GPU host)
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import torch

from petal.bench.gpu import cuda_engine, random_docs
from petal.bench.shapes import shape
from petal.engine.batch import PackedBatch, token_bucket
from petal.engine.engine import Engine
from petal.engine.inputs import fill_inputs
from petal.engine.lazy_tensor import LazyTensor


def per_call_us(fn, reps: int = 300) -> float:
    started = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - started) / reps * 1e6


def main() -> None:
    name, num_tokens = sys.argv[1], int(sys.argv[2])  # [--profile]: host_profile() after the table
    s = shape(name)
    engine = cuda_engine(s)
    spec = engine.spec
    batch = PackedBatch.from_sequences(random_docs(np.array([num_tokens]), spec.config.vocab_size))
    for _ in range(5):
        engine.step(batch).result()
    runner = engine.graphs
    assert runner is not None, "needs CUDA graphs"
    state = runner.states[token_bucket(num_tokens)]
    graph = state.graph
    assert graph is not None, "the bucket's graph is captured by the warm-up steps"
    with torch.inference_mode():
        rows = {
            "full step -> result": per_call_us(lambda: engine.step(batch).result()),
            "fill_inputs (numpy)": per_call_us(lambda: fill_inputs(state.host_numpy, state.layout, batch)),
            "attention.plan": per_call_us(lambda: engine.attention.plan(state.ctx)),
            "graph.replay launch (no sync)": per_call_us(lambda: graph.replay(), reps=50),
        }
        torch.cuda.synchronize()
        out = runner.output[:1]
        rows["ring.submit + result"] = per_call_us(lambda: engine.ring.submit(out).result())
        side, staging = torch.cuda.Stream(), torch.empty_like(runner.output)
        pinned = torch.empty(out.shape, dtype=torch.float32, pin_memory=True)

        def through_copy_stream() -> None:  # the ring before: device copy, then D2H on a side stream
            staging[:1].copy_(out)
            computed = torch.cuda.Event()
            computed.record()
            with torch.cuda.stream(side):
                side.wait_event(computed)
                pinned.copy_(staging[:1], non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(side)
            copied.synchronize()

        rows["  before: via a copy stream"] = per_call_us(through_copy_stream)

        def replay_and_sync() -> None:
            graph.replay()
            torch.cuda.synchronize()

        rows["one replay + synchronize"] = per_call_us(replay_and_sync, reps=100)
        host_s = 0.0
        for _ in range(300):
            started = time.perf_counter()
            lazy = engine.step(batch)
            host_s += time.perf_counter() - started
            lazy.result()
        rows["engine.step host time (returns)"] = host_s / 300 * 1e6
        # the whole step with the ring's copy before and now, taking turns (same process, same graph)
        direct = engine.ring.submit
        side_ring = torch.empty(4, *runner.output.shape, dtype=torch.float32, pin_memory=True)
        turn = [0]

        def old_submit(result: torch.Tensor, stream: torch.cuda.Stream | None = None) -> LazyTensor:
            rows_n = int(result.shape[0])
            slot = turn[0] % 4
            turn[0] += 1
            staging[:rows_n].copy_(result)
            computed = torch.cuda.Event()
            computed.record()
            with torch.cuda.stream(side):
                side.wait_event(computed)
                side_ring[slot][:rows_n].copy_(staging[:rows_n], non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(side)
            return LazyTensor(side_ring[slot], rows_n, copied, staging)

        best: dict[str, float] = {}
        for label in ("now: D2H on the compute stream", "before: via a copy stream") * 3:
            engine.ring.submit = direct if label.startswith("now") else old_submit  # type: ignore[method-assign]
            us = per_call_us(lambda: engine.step(batch).result())
            best[label] = min(best.get(label, us), us)
        engine.ring.submit = direct  # type: ignore[method-assign]
        for label, us in best.items():
            rows[f"full step, {label}"] = us
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(100):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        rows["graph replay device time"] = start.elapsed_time(end) * 10  # us per replay
    for key, us in rows.items():
        print(f"{name} {num_tokens:>5} tokens  {key:<32} {us:8.1f} us")
    if "--profile" in sys.argv:
        host_profile(engine, batch, state)


class _TimedGraph:
    """A graph whose ``replay`` notes when it was called (the host's time to the launch)."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.called = 0.0

    def replay(self) -> None:
        self.called = time.perf_counter()
        self.graph.replay()


def host_profile(engine: Engine, batch: PackedBatch, state: Any) -> None:
    """Where the host's part of a step goes: the time from ``step()`` to the graph's launch, and cProfile's
    functions by own time over 300 steps."""
    import cProfile
    import pstats

    timed = _TimedGraph(state.graph)
    state.graph = timed
    to_launch = 0.0
    for _ in range(300):
        started = time.perf_counter()
        lazy = engine.step(batch)
        to_launch += timed.called - started
        lazy.result()
    print(f"  step() call -> graph launch: {to_launch / 300 * 1e6:.1f} us")
    stage_times(engine, batch, state)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(300):
        engine.step(batch).result()
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(18)
    state.graph = timed.graph



def stage_times(engine: Engine, batch: PackedBatch, state: Any) -> None:
    """``LazyGraphRunner.run`` and the ring's submit written out here with a clock between the stages (a
    replica of engine/graphs.py: keep in step with it), 300 steps, mean us per stage."""
    runner = engine.graphs
    assert runner is not None
    names = ["bucket + state", "copied.synchronize", "fill_inputs", "cu_seqlens view + plan", "graph.replay",
             "ring.submit", "result()"]
    totals = [0.0] * len(names)
    stream = torch.cuda.current_stream()
    # NOTE: outside inference_mode, as engine/graphs.py's replay path runs
    for _ in range(300):
        t = [time.perf_counter()]
        st = runner._state(token_bucket(batch.num_tokens))
        t.append(time.perf_counter())
        if st.pending and st.copied is not None:
            st.copied.synchronize()
        t.append(time.perf_counter())
        fill_inputs(st.host_numpy, st.layout, batch)
        t.append(time.perf_counter())
        st.ctx.cu_seqlens_cpu = st.host_cu_seqlens
        engine.attention.plan(st.ctx)
        t.append(time.perf_counter())
        graph = st.graph
        assert graph is not None
        graph.replay()
        st.pending = True
        t.append(time.perf_counter())
        lazy = engine.ring.submit(runner.output[: batch.num_seqs], stream)
        t.append(time.perf_counter())
        lazy.result()
        t.append(time.perf_counter())
        for i in range(len(names)):
            totals[i] += t[i + 1] - t[i]
    print("  stages (us): " + " | ".join(f"{n} {v / 300 * 1e6:.1f}" for n, v in zip(names, totals)))


if __name__ == "__main__":
    main()
