"""Would two half-size steps on two CUDA streams beat one full step? (T1 documents, one process.)

    python3 bench/overlap_probe.py [SHAPE]        (on the GPU host; default pplx-embed-0.6b)

Two engines share one model (each its own graphs, attention plans and memory pool). Timed, best of
three rounds of the same 512-token documents:
- one engine with a 16384-token budget, a step then its result (the T1 step);
- one engine with an 8192-token budget, the same documents in twice the steps;
- two 8192-token engines, each step launched on its own stream and both results read after: the GPU
  may run one half's memory-bound kernels (norms, SwiGLU, RoPE) beside the other's GEMMs.
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
    name = sys.argv[1] if len(sys.argv) > 1 else "pplx-embed-0.6b"
    s = shape(name)
    hf = hf_model(s, torch.device("cuda"), torch.bfloat16)
    spec, model = native_from_hf(s, hf, torch.device("cuda"), torch.bfloat16)
    del hf
    torch.cuda.empty_cache()
    vocab = spec.config.vocab_size
    docs = random_docs(np.full(32 * 16, 512), vocab, seed=1)  # 16 full steps of 16384 tokens
    full = [PackedBatch.from_sequences(docs[i : i + 32]) for i in range(0, len(docs), 32)]
    half = [PackedBatch.from_sequences(docs[i : i + 16]) for i in range(0, len(docs), 16)]
    tokens = sum(b.num_tokens for b in full)

    def engine(budget: int) -> Engine:
        return Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=budget), model=model)

    big, small_a, small_b = engine(16384), engine(8192), engine(8192)
    streams = (torch.cuda.Stream(), torch.cuda.Stream())

    def one_big() -> None:
        for batch in full:
            big.step(batch).result()

    def one_small() -> None:
        for batch in half:
            small_a.step(batch).result()

    def two_streams() -> None:
        for i in range(0, len(half), 2):
            with torch.cuda.stream(streams[0]):
                first = small_a.step(half[i])
            with torch.cuda.stream(streams[1]):
                second = small_b.step(half[i + 1])
            first.result()
            second.result()

    def pipelined_big() -> None:  # two steps in flight, as `petal index` keeps them
        pending = []
        for batch in full:
            pending.append(big.step(batch))
            if len(pending) > 1:
                pending.pop(0).result()
        for lazy in pending:
            lazy.result()

    variants = {"16384, serial": one_big, "16384, 2 in flight": pipelined_big, "8192, serial": one_small,
                "2 x 8192 on two streams": two_streams}
    for fn in variants.values():  # warm: captures
        fn()
    best = {label: float("inf") for label in variants}
    for _ in range(3):
        for label, fn in variants.items():
            torch.cuda.synchronize()
            started = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            best[label] = min(best[label], time.perf_counter() - started)
    # the halves on two streams must give the vectors one engine gives
    ref = np.concatenate([big.step(b).result() for b in full[:1]])
    with torch.cuda.stream(streams[0]):
        a = small_a.step(half[0])
    with torch.cuda.stream(streams[1]):
        b = small_b.step(half[1])
    got = np.concatenate([a.result(), b.result()])
    cos = float(((ref * got).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))).min())
    base = best["16384, serial"]
    print(f"{name}: {tokens} tokens of 512-token documents; min cosine two streams vs one engine {cos:.6f}")
    print("| variant | k tok/s | vs 16384 serial |")
    print("|---|---|---|")
    for label, seconds in best.items():
        print(f"| {label} | {tokens / seconds / 1e3:.0f} | {base / seconds:.3f} |")


if __name__ == "__main__":
    main()
