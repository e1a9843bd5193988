"""Where a step's time goes: CUDA kernels of one eager step and of the bucket's graph (torch profiler),
and graph replay time.

    python3 bench/profile_step.py SHAPE NUM_TOKENS [SEQ_LEN]     (on the GPU host)
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch

from petal.bench.gpu import random_docs
from petal.bench.shapes import hf_model, native_from_hf, shape
from petal.engine.batch import PackedBatch
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine


def main() -> None:
    name, num_tokens = sys.argv[1], int(sys.argv[2])
    seq_len = int(sys.argv[3]) if len(sys.argv) > 3 else min(num_tokens, 512)
    s = shape(name)
    hf = hf_model(s, torch.device("cuda"), torch.bfloat16)
    spec, model = native_from_hf(s, hf, torch.device("cuda"), torch.bfloat16)
    del hf
    lengths = np.full(max(1, num_tokens // seq_len), seq_len)
    batch = PackedBatch.from_sequences(random_docs(lengths, spec.config.vocab_size))
    for graphs in (False, True):
        engine = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=max(16384, num_tokens),
                                           cuda_graphs=graphs), model=model)
        for _ in range(5):
            engine.step(batch).result()
        torch.cuda.synchronize()
        reps = 50
        started = time.perf_counter()
        for _ in range(reps):
            engine.step(batch).result()
        ms = (time.perf_counter() - started) / reps * 1000
        print(f"{name} {batch.num_tokens} tokens ({batch.num_seqs} seqs), graphs={graphs}: {ms:.3f} ms/step "
              f"(step->result, serial), {batch.num_tokens / ms * 1000 / 1e3:,.0f}k tok/s")
        if not graphs:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    engine.step(batch).result()
            events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
            kernels = sum(e.count for e in events) / 3
            total = sum(e.self_device_time_total for e in events) / 3 / 1000
            print(f"  eager: {kernels:.0f} device ops per step, {total:.3f} ms device time per step")
            for e in sorted(events, key=lambda e: -e.self_device_time_total)[:22]:
                print(f"  {e.self_device_time_total / 3 / 1000:8.3f} ms  {e.count / 3:6.0f}x  {e.key[:100]}")
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        if graphs:
            assert engine.graphs is not None
            graph = engine.graphs.states[max(engine.graphs.states)].graph
            assert graph is not None
            start.record()
            for _ in range(reps):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            print(f"  graph replay alone: {start.elapsed_time(end) / reps:.3f} ms")
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                for _ in range(3):
                    graph.replay()
                torch.cuda.synchronize()
            events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
            total = sum(e.self_device_time_total for e in events) / 3 / 1000
            memsets = sum(e.count for e in events if "memset" in e.key.lower()) / 3
            print(f"  graph: {sum(e.count for e in events) / 3:.0f} kernels per replay ({memsets:.0f} memsets), "
                  f"{total:.3f} ms device time")
            for e in sorted(events, key=lambda e: -e.self_device_time_total)[:10]:
                print(f"  {e.self_device_time_total / 3 / 1000:8.3f} ms  {e.count / 3:6.0f}x  {e.key[:100]}")


if __name__ == "__main__":
    main()
