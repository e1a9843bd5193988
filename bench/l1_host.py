"""Host-side cost of one small step (L1): where the microseconds go outside the GPU.

    python3 bench/l1_host.py SHAPE NUM_TOKENS      (on the GPU host)
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from petal.bench.gpu import random_docs
from petal.bench.shapes import hf_model, native_from_hf, shape
from petal.engine.batch import PackedBatch, token_bucket
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine
from petal.engine.inputs import fill_inputs


def per_call_us(fn, reps: int = 300) -> float:
    started = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - started) / reps * 1e6


def main() -> None:
    name, num_tokens = sys.argv[1], int(sys.argv[2])
    s = shape(name)
    hf = hf_model(s, torch.device("cuda"), torch.bfloat16)
    spec, model = native_from_hf(s, hf, torch.device("cuda"), torch.bfloat16)
    del hf
    engine = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=16384), model=model)
    batch = PackedBatch.from_sequences(random_docs(np.array([num_tokens]), spec.config.vocab_size))
    for _ in range(5):
        engine.step(batch).result()
    runner = engine.graphs
    assert runner is not None, "needs CUDA graphs"
    state = runner.states[token_bucket(num_tokens)]
    graph = state.graph
    assert graph is not None, "the bucket's graph is captured by the warm-up steps"
    slot, host = runner.staging.acquire()
    runner.staging.release(slot)
    with torch.inference_mode():
        rows = {
            "full step -> result": per_call_us(lambda: engine.step(batch).result()),
            "fill_inputs (numpy)": per_call_us(lambda: fill_inputs(host.numpy(), state.layout, batch)),
            "attention.plan": per_call_us(lambda: engine.attention.plan(state.ctx)),
            "graph.replay launch (no sync)": per_call_us(lambda: graph.replay(), reps=50),
        }
        torch.cuda.synchronize()
        out = runner.output[:1]
        rows["ring.submit + result"] = per_call_us(lambda: engine.ring.submit(out).result())
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


if __name__ == "__main__":
    main()
