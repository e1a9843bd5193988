"""Why is a step after an idle gap slower? A GPU kept busy through the gap, on the GPU host.

    python3 bench/idle_gap_probe.py [SHAPE] [NUM_TOKENS ...]        (default: pplx-embed-0.6b 16 128)

A lone step (`step -> result`, host wall time) of the shape's engine (random weights, CUDA graphs), 200 calls
each, variants taking turns call by call:

- ``back_to_back``: the next step launched as soon as the last one's result is in;
- ``idle``: the host sleeps ``GAP_MS`` first, the GPU idle meanwhile;
- ``busy_gap``: the same sleep, while one program of ``torch.cuda._sleep`` spins on a side stream for the
  gap (ending just before the step): if the step is still slow, the cost is not the GPU going idle;
- ``busy_through``: a side-stream spin that lasts past the step's launch (the step shares the GPU with it);
- ``host_spin``: the launching thread busy-waits through the gap instead of sleeping (GPU idle);
- ``host_spin_busy``: both, the host thread busy and the GPU kept busy;
- ``yield_spin``: the launching thread spins through the gap calling ``os.sched_yield()`` (the GIL released at
  each call, as a server's engine thread would have to);
- ``handoff_sleep`` / ``handoff_spin``: the serving case: a worker thread launches the step when another thread
  wakes it through a ``threading.Condition`` after the gap; it waited in ``Condition.wait`` (asleep), or
  spun on ``os.sched_yield()`` for up to ``SPIN_MS`` after its last step before waiting (each is woken once
  for a step, then again after the gap: the second is timed, from the notify to the result).
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import torch

from petal.bench.gpu import probe_engine, warm_lone_batch
from petal.engine.batch import PackedBatch
from petal.engine.engine import Engine

GAP_MS = 2.0
SPIN_MS = 5.0
CALLS = 200


class Handoff:
    """A thread that runs one step each time it is woken (``trigger``), after waiting asleep or spinning."""

    def __init__(self, engine: Engine, batch: PackedBatch, spin_s: float) -> None:
        self.engine, self.batch, self.spin_s = engine, batch, spin_s
        self.cond = threading.Condition()
        self.go = False
        self.done = threading.Event()
        self.finished = 0.0
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while True:
            until = time.perf_counter() + self.spin_s
            while not self.go and time.perf_counter() < until:
                os.sched_yield()
            with self.cond:
                while not self.go:
                    self.cond.wait()
                self.go = False
            self.engine.step(self.batch).result()
            self.finished = time.perf_counter()
            self.done.set()

    def trigger(self) -> float:
        """Wake the thread; returns how long from the wake-up call to the step's result (us)."""
        self.done.clear()
        woken = time.perf_counter()
        with self.cond:
            self.go = True
            self.cond.notify()
        self.done.wait()
        return (self.finished - woken) * 1e6


def main() -> None:
    name, engine, token_counts = probe_engine(sys.argv)
    side = torch.cuda.Stream(priority=0)
    # calibrate torch.cuda._sleep: cycles per ms
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(side):
        start.record()
        torch.cuda._sleep(2_000_000)
        end.record()
    end.synchronize()
    cycles_per_ms = 2_000_000 / start.elapsed_time(end)
    print(f"{name} | _sleep: {cycles_per_ms / 1e3:.0f} kcycles a ms", flush=True)
    for num_tokens in token_counts:
        batch = warm_lone_batch(engine, num_tokens)
        print(f"{num_tokens} tokens", flush=True)
        run(engine, batch, side, cycles_per_ms)


def run(engine: Engine, batch: PackedBatch, side: torch.cuda.Stream, cycles_per_ms: float) -> None:
    def gap(spin_ms: float | None, host_spin: bool = False, yield_spin: bool = False) -> None:
        if spin_ms is not None:
            with torch.cuda.stream(side):
                torch.cuda._sleep(int(spin_ms * cycles_per_ms))
        if host_spin or yield_spin:
            until = time.perf_counter() + GAP_MS / 1000
            while time.perf_counter() < until:
                if yield_spin:
                    os.sched_yield()
        else:
            time.sleep(GAP_MS / 1000)

    variants = {
        "back_to_back": lambda: None,
        "idle": lambda: gap(None),
        "busy_gap": lambda: gap(GAP_MS - 0.05),
        "busy_through": lambda: gap(GAP_MS + 2.0),
        "host_spin": lambda: gap(None, host_spin=True),
        "host_spin_busy": lambda: gap(GAP_MS - 0.05, host_spin=True),
        "yield_spin": lambda: gap(None, yield_spin=True),
    }
    handoffs = {"handoff_sleep": Handoff(engine, batch, 0.0), "handoff_spin": Handoff(engine, batch, SPIN_MS / 1000)}
    times: dict[str, list[tuple[float, float, float]]] = {v: [] for v in [*variants, *handoffs]}
    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(CALLS):
        for variant, before in variants.items():
            torch.cuda.synchronize()
            before()
            started = time.perf_counter()
            first.record()
            lazy = engine.step(batch)
            launched = time.perf_counter()
            last.record()
            lazy.result()
            done = time.perf_counter()
            times[variant].append(((done - started) * 1e6, (launched - started) * 1e6, first.elapsed_time(last) * 1e3))
        for variant, handoff in handoffs.items():
            handoff.trigger()  # NOTE: a step just before, so the spinning worker spins through the gap below
            time.sleep(GAP_MS / 1000)
            times[variant].append((handoff.trigger(), float("nan"), float("nan")))
    for variant, values in times.items():
        a = np.array(values)
        print(f"  {variant:15s} p50 {np.percentile(a[:, 0], 50):7.1f} us  p90 {np.percentile(a[:, 0], 90):7.1f}  "
              f"min {a[:, 0].min():7.1f} | step() host p50 {np.percentile(a[:, 1], 50):6.1f} us | device, "
              f"first to last event p50 {np.percentile(a[:, 2], 50):7.1f} us", flush=True)


if __name__ == "__main__":
    main()
