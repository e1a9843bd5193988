"""A lone step's host time before its graph runs: the engine's path against two leaner replicas, on the GPU host.

(Written against the engine before 2026-12-03, whose replay filled a staging slot and copied it with a call of
its own; the engine now does what ``in_graph`` does: bench/HISTORY.md, "A lone step's host path".)

    python3 bench/prelaunch_probe.py [SHAPE] [NUM_TOKENS ...]        (default: pplx-embed-0.6b 16 128)

Variants, taking turns call by call, each back to back and after a 2 ms sleep of the launching thread
(``step -> result`` p50 of host wall time, 200 calls):

- ``engine``: ``engine.step(batch).result()`` as the server and ``petal bench gpu`` call it;
- ``lean``: the same work (fill the pinned slot, copy it to the bucket's inputs, replay, copy the rows
  back, wait), inside one ``inference_mode`` for the whole run, with the stream and the slot's views looked up once;
- ``in_graph``: the bucket's graph captured again with the input copy as its first node (from one pinned
  buffer of the bucket): the host fills that buffer and replays; no copy call, no staging event.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from petal.bench.gpu import probe_engine, warm_lone_batch
from petal.engine.batch import PackedBatch, token_bucket
from petal.engine.engine import Engine
from petal.engine.inputs import fill_inputs

CALLS = 200
GAP_S = 0.002


def main() -> None:
    name, engine, token_counts = probe_engine(sys.argv)
    for num_tokens in token_counts:
        batch = warm_lone_batch(engine, num_tokens)
        reference = engine.step(batch).result()
        print(f"{name} {num_tokens} tokens", flush=True)
        # NOTE: the engine's tensors are inference tensors: the lean variants run inside one inference_mode
        # (what a thread that entered it once would do); the engine enters it again each step, as it does
        with torch.inference_mode():
            run(engine, batch, reference)


def run(engine: Engine, batch: PackedBatch, reference: np.ndarray) -> None:
    runner = engine.graphs
    assert runner is not None
    state = runner.states[token_bucket(batch.num_tokens)]
    size = state.layout.size
    stream = torch.cuda.current_stream()
    rows = batch.num_seqs
    out_host = torch.empty(runner.output.shape, dtype=torch.float32, pin_memory=True)
    done_event = torch.cuda.Event()
    slot_events = [torch.cuda.Event() for _ in range(4)]
    slots = [torch.zeros(size, dtype=torch.int32, pin_memory=True) for _ in range(4)]
    slot_np = [slot.numpy() for slot in slots]
    turn = [0]
    graph = state.graph
    assert graph is not None

    def finish() -> np.ndarray:
        out_host[:rows].copy_(runner.output[:rows], non_blocking=True)
        done_event.record(stream)
        done_event.synchronize()
        return out_host[:rows].numpy().copy()

    def lean() -> np.ndarray:
        i = turn[0] = (turn[0] + 1) % 4
        slot_events[i].synchronize()
        fill_inputs(slot_np[i], state.layout, batch)
        state.buffer.copy_(slots[i], non_blocking=True)
        slot_events[i].record(stream)
        graph.replay()
        return finish()

    pinned = torch.zeros(size, dtype=torch.int32, pin_memory=True)
    pinned_np = pinned.numpy()
    fill_inputs(pinned_np, state.layout, batch)

    def body() -> None:
        state.buffer.copy_(pinned, non_blocking=True)
        runner.output[:state.layout.num_seqs].copy_(runner.forward(state.ctx))

    in_graph_graph = runner.capture(body)
    consumed = torch.cuda.Event()

    def in_graph() -> np.ndarray:
        consumed.synchronize()
        fill_inputs(pinned_np, state.layout, batch)
        in_graph_graph.replay()
        consumed.record(stream)
        return finish()

    variants: dict[str, Callable[[], np.ndarray]] = {
        "engine": lambda: engine.step(batch).result(),
        "lean": lean,
        "in_graph": in_graph,
    }
    for label, fn in variants.items():
        got = fn()
        cos = float((got * reference).sum() / np.linalg.norm(got) / np.linalg.norm(reference))
        print(f"  {label}: cosine to the engine's result {cos:.6f}", flush=True)
    times: dict[str, list[float]] = {f"{v} {g}": [] for g in ("back_to_back", "after_gap") for v in variants}
    for _ in range(CALLS):
        for gap in ("back_to_back", "after_gap"):
            for label, fn in variants.items():
                torch.cuda.synchronize()
                if gap == "after_gap":
                    time.sleep(GAP_S)
                started = time.perf_counter()
                fn()
                times[f"{label} {gap}"].append((time.perf_counter() - started) * 1e6)
    for key, values in times.items():
        a = np.array(values)
        print(f"  {key:24s} p50 {np.percentile(a, 50):7.1f} us  p90 {np.percentile(a, 90):7.1f}  min {a.min():7.1f}",
              flush=True)


if __name__ == "__main__":
    main()
