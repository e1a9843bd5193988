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
- ``host_spin_busy``: both, the host thread busy and the GPU kept busy.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from petal.bench.gpu import cuda_engine, random_docs
from petal.bench.shapes import shape
from petal.engine.batch import PackedBatch
from petal.engine.engine import Engine

GAP_MS = 2.0
CALLS = 200


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "pplx-embed-0.6b"
    token_counts = [int(a) for a in sys.argv[2:]] or [16, 128]
    s = shape(name)
    engine = cuda_engine(s)
    spec = engine.spec
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
        batch = PackedBatch.from_sequences(random_docs(np.array([num_tokens]), spec.config.vocab_size))
        for _ in range(10):
            engine.step(batch).result()
        print(f"{num_tokens} tokens", flush=True)
        run(engine, batch, side, cycles_per_ms)


def run(engine: Engine, batch: PackedBatch, side: torch.cuda.Stream, cycles_per_ms: float) -> None:
    def gap(spin_ms: float | None, host_spin: bool = False) -> None:
        if spin_ms is not None:
            with torch.cuda.stream(side):
                torch.cuda._sleep(int(spin_ms * cycles_per_ms))
        if host_spin:
            until = time.perf_counter() + GAP_MS / 1000
            while time.perf_counter() < until:
                pass
        else:
            time.sleep(GAP_MS / 1000)

    variants = {
        "back_to_back": lambda: None,
        "idle": lambda: gap(None),
        "busy_gap": lambda: gap(GAP_MS - 0.05),
        "busy_through": lambda: gap(GAP_MS + 2.0),
        "host_spin": lambda: gap(None, host_spin=True),
        "host_spin_busy": lambda: gap(GAP_MS - 0.05, host_spin=True),
    }
    times: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
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
    for variant, values in times.items():
        a = np.array(values)
        print(f"  {variant:15s} p50 {np.percentile(a[:, 0], 50):7.1f} us  p90 {np.percentile(a[:, 0], 90):7.1f}  "
              f"min {a[:, 0].min():7.1f} | step() host p50 {np.percentile(a[:, 1], 50):6.1f} us | device, "
              f"first to last event p50 {np.percentile(a[:, 2], 50):7.1f} us", flush=True)


if __name__ == "__main__":
    main()
