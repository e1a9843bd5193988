"""The skinny Qwen3 layer on the GPU host, eighth round: the attention inside the O projection
(``engine/layers/skinny_linear.py``), the 128-token bucket's attention as one key block, and how much of a
layer is weight streaming at all. (Weights prefetched one kernel further ahead, as each kernel's share of an
L2 prefetch of the next kernel's whole weight, were measured here too and dropped: 1.2-2.4 us a layer slower.)

    python3 bench/attention_o_probe.py [SECTION ...]      (default: check ceiling tiles whole engine)

- ``check``: ``attention_add`` against the attention kernel + ``linear_add`` (same tiles' split order aside)
  and ``skinny_layer`` with every option against PDL alone on the same input, eager and as graph replays.
- ``ceiling``: per-layer device time of 28 chained layers (CUDA graph) at 16/32/64/128 rows for each option
  set, with 28 distinct layers' weights (reads from HBM) and with one layer's weights 28 times (from L2: what
  prefetching could buy at most). ``attention_o`` tiles are given to every bucket here.
- ``tiles``: the fused attention + O kernel's tiles per bucket (head split, columns, warps) in the chain.
- ``whole``: the 128-token bucket's attention with every slot as one key block against the blocked loop.
- ``engine``: L1 (step -> result, 400 calls, one sequence of 16/30/60/128 tokens) of the pplx-embed-0.6b
  shape for each option set, two rounds taking turns in one process, and each one's vectors against the first.
"""

# ruff: noqa: B023  (each closure below is timed inside the loop iteration that made it)
from __future__ import annotations

import gc
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from petal.bench.gpu import graph_us_per_call, latency, random_docs, replay_in_graph, run_sections
from petal.bench.shapes import hf_model, native_from_hf, shape
from petal.engine.batch import PackedBatch
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine
from petal.engine.layers.rotary import RotaryEmbedding
from petal.engine.layers.skinny_linear import (
    BUCKET_TILES,
    GemmTiles,
    LayerTiles,
    NormInput,
    SkinnyLayerWeights,
    SkinnyOptions,
    attention_add,
    layer_tiles,
    linear_add,
    norm_input,
    skinny_layer,
)
from petal.engine.layers.small_attention import SmallAttention, attend

CUDA = torch.device("cuda")
BF16 = torch.bfloat16
LAYERS = 28
HIDDEN, HQ, HK, D, INTER, EPS = 1024, 16, 8, 128, 3072, 1e-6  # pplx-embed-0.6b
OPTIONS = {"pdl": SkinnyOptions(True), "in_o": SkinnyOptions(True, True)}
ATTENTION_O = GemmTiles(16, 32, split_k=8)  # block_m: the bucket's rows
SUMMARY: list[str] = []


def say(line: str) -> None:
    print(line, flush=True)
    SUMMARY.append(line)


def random_layer(seed: int) -> SkinnyLayerWeights:
    gen = torch.Generator(device=CUDA).manual_seed(seed)

    def randn(*size: int) -> torch.Tensor:
        return (torch.randn(*size, device=CUDA, generator=gen) * size[-1] ** -0.5).to(BF16)

    def gain(*size: int) -> torch.Tensor:
        return (torch.rand(*size, device=CUDA, generator=gen) + 0.5).to(BF16)

    return SkinnyLayerWeights(gain(HIDDEN), randn((HQ + 2 * HK) * D, HIDDEN), randn(HIDDEN, HQ * D), gain(HIDDEN),
                              randn(2 * INTER, HIDDEN), randn(HIDDEN, INTER), gain(2, D), EPS)


def step_attention(lengths: list[int], bucket: int, causal: bool = False) -> SmallAttention:
    """A graph bucket's attention inputs: sequences of ``lengths``, padding in a dummy sequence of its own."""
    seq, pos = [], []
    for i, n in enumerate(lengths):
        seq += [i] * n
        pos += list(range(n))
    pad = bucket - len(seq)
    seq += [len(lengths)] * pad
    pos += list(range(pad))
    cu = np.concatenate([[0], np.cumsum(lengths), [bucket]])
    table = RotaryEmbedding(D, 4096, 1e6).cos_sin(CUDA)
    return SmallAttention(torch.tensor(seq, dtype=torch.int32, device=CUDA), torch.tensor(cu, dtype=torch.int32,
                          device=CUDA), HQ, HK, D, causal, D**-0.5, torch.tensor(pos, dtype=torch.int32, device=CUDA),
                          table, (torch.rand(2, D, device=CUDA) + 0.5).to(BF16), EPS)


def chain(layers: list[SkinnyLayerWeights], rows: int, options: SkinnyOptions, tiles: LayerTiles | None = None):
    """28 layers at ``rows`` token slots (one sequence) as the engine chains them; returns (run, h)."""
    gen = torch.Generator(device=CUDA).manual_seed(rows)  # the same input for every variant
    x0 = torch.randn(rows, HIDDEN, device=CUDA, dtype=BF16, generator=gen)
    h = x0.clone()
    attention = step_attention([rows], rows)
    t = tiles or layer_tiles(rows)
    if t.attention_o is None and rows <= 64:
        t = replace(t, attention_o=replace(ATTENTION_O, block_m=rows))

    def run() -> None:
        h.copy_(x0)
        x: NormInput | None = norm_input(h, layers[0].input_norm)
        for i, layer in enumerate(layers):
            assert x is not None
            x = skinny_layer(h, x, layer, layers[i + 1] if i + 1 < len(layers) else None, attention, t, options)

    return run, h


def warm(layers: list[SkinnyLayerWeights], jobs: list[tuple[int, SkinnyOptions, LayerTiles | None]]) -> None:
    """Compile every chain variant first, in threads (a bare host's Triton cache is empty)."""
    def one(job: tuple[int, SkinnyOptions, LayerTiles | None]) -> None:
        rows, options, tiles = job
        with torch.inference_mode():
            run, _ = chain(layers[:2], rows, options, tiles)
            run()

    started = time.perf_counter()
    with ThreadPoolExecutor(12) as pool:
        list(pool.map(one, jobs))
    torch.cuda.synchronize()
    print(f"  (compiled {len(jobs)} chains in {time.perf_counter() - started:.1f} s)", flush=True)


def section_check() -> None:
    layers = [random_layer(i) for i in range(3)]
    say("\ncheck: attention_add vs attention kernel + linear_add; skinny_layer options vs off (eager / graph)")
    for lengths, bucket, causal in (([16], 16, False), ([5, 7], 16, True), ([30], 32, False), ([1], 16, False),
                                    ([10, 20, 30], 64, False), ([60], 64, True)):
        attention = replace(step_attention(lengths, bucket, causal), qk_norm_weights=layers[0].qk_norm)
        qkv = torch.randn(bucket, (HQ + 2 * HK) * D, device=CUDA, dtype=BF16) * 2
        res = torch.randn(bucket, HIDDEN, device=CUDA, dtype=BF16)
        tiles = replace(ATTENTION_O, block_m=bucket)
        sep = linear_add(attend(qkv, attention).view(bucket, HQ * D), layers[0].o, res.clone(),
                         norm_weight=layers[0].post_norm, tiles=tiles)
        cells = []
        for pdl in (False, True):
            fused = attention_add(qkv, attention, layers[0].o, res.clone(), norm_weight=layers[0].post_norm, pdl=pdl,
                                  tiles=tiles)
            assert sep[1] is not None and fused[1] is not None
            err = float((fused[0].float() - sep[0].float()).abs().max())
            rel = float(((fused[1].sumsq.sum(0) - sep[1].sumsq.sum(0)).abs() / sep[1].sumsq.sum(0)).max())
            cells.append(f"pdl={pdl} max|diff| {err:.4f} sumsq rel {rel:.1e}")
            assert err < 0.05 and rel < 1e-3, (lengths, pdl, err, rel)
        say(f"  attention_add {lengths} bucket {bucket} causal={causal}: " + " | ".join(cells))
    for rows in (16, 32, 64, 128):
        outs = {}
        for label, options in OPTIONS.items():
            run, h = chain(layers, rows, options)
            run()
            eager = h.clone()
            replay_in_graph(run)
            assert torch.equal(h, eager), (rows, label, "graph replay differs from eager")
            outs[label] = eager.float()
        ref = outs["pdl"]
        cells = [f"{k} {float((v - ref).norm() / ref.norm()):.2e}" for k, v in outs.items() if k != "pdl"]
        say(f"  layer chain {rows} rows, rel. diff to pdl-only (graph == eager for all): " + " | ".join(cells))


def section_ceiling() -> None:
    distinct = [random_layer(i) for i in range(LAYERS)]
    same = [distinct[0]] * LAYERS
    warm(distinct, [(rows, o, None) for rows in (16, 32, 64, 128) for o in OPTIONS.values()])
    say("\nceiling: chain of 28 layers, device us per layer: distinct weights (HBM) / one layer's (L2)")
    for rows in (16, 32, 64, 128):
        cells = []
        for label, options in OPTIONS.items():
            if options.attention_in_o and rows > 64:
                continue
            cold = graph_us_per_call(chain(distinct, rows, options)[0], LAYERS)
            hot = graph_us_per_call(chain(same, rows, options)[0], LAYERS)
            cells.append(f"{label} {cold:.2f}/{hot:.2f}")
        say(f"  {rows:3d} rows: " + " | ".join(cells))


def section_tiles() -> None:
    layers = [random_layer(i) for i in range(LAYERS)]
    options = OPTIONS["in_o"]
    candidates = {}
    for rows in (16, 32, 64):
        base = layer_tiles(rows)
        cands = [GemmTiles(rows, bn, 128, split, warps) for bn in (32, 64) for split in (4, 8, 16) for warps in (4, 8)
                 if not (rows == 64 and warps == 4 and split == 4)]
        candidates[rows] = [replace(base, attention_o=c) for c in cands]
    warm(layers, [(rows, options, t) for rows, ts in candidates.items() for t in ts])
    say("\ntiles: attention + O tiles (block_n, split, warps) in the 28-layer chain, us per layer")
    for rows, ts in candidates.items():
        timed = sorted((graph_us_per_call(chain(layers, rows, options, t)[0], LAYERS), t) for t in ts)
        best = ", ".join(f"{us:.2f} (n{t.attention_o.block_n} s{t.attention_o.split_k} w{t.attention_o.num_warps})"
                         for us, t in timed[:4] if t.attention_o is not None)
        now = BUCKET_TILES[rows].attention_o
        say(f"  {rows:3d} rows: best {best}; today's {now}")


def section_whole() -> None:
    say("\nwhole: 128-token bucket attention, us per layer in a graph of 28 inputs (blocked = today's)")
    for lengths in ([128], [100], [60, 60], [30, 30, 30, 30]):
        attention = step_attention(lengths, 128)
        qkvs = [torch.randn(128, (HQ + 2 * HK) * D, device=CUDA, dtype=BF16) for _ in range(LAYERS)]
        variants: dict[str, dict[str, Any]] = {
                    "blocked": {"whole": False}, "whole m16 w4": dict(block_m=16, block_n=128, whole=True),
                    "whole m32 w4": dict(block_m=32, block_n=128, whole=True),
                    "whole m16 w8": dict(block_m=16, block_n=128, whole=True, num_warps=8),
                    "whole m32 w8": dict(block_m=32, block_n=128, whole=True, num_warps=8)}
        ref = attend(qkvs[0], attention).float()
        cells = []
        for label, kw in variants.items():
            def run(kw: dict[str, Any] = kw) -> None:
                for x in qkvs:
                    attend(x, attention, **kw)

            try:
                us = graph_us_per_call(run, LAYERS)
                err = float((attend(qkvs[0], attention, **kw).float() - ref).abs().max())
                cells.append(f"{label} {us:.2f} (diff {err:.4f})")
            except Exception as exc:  # a variant that does not compile (registers) is reported, not fatal
                cells.append(f"{label} FAILED {type(exc).__name__}")
        say(f"  {lengths}: " + " | ".join(cells))


def section_engine() -> None:
    from petal.engine.layers import small_attention

    s = shape("pplx-embed-0.6b")
    hf = hf_model(s, CUDA, BF16)
    spec, model = native_from_hf(s, hf, CUDA, BF16)
    del hf
    gc.collect()
    torch.cuda.empty_cache()
    vocab = spec.config.vocab_size
    lengths = (16, 30, 60, 128)
    configs = {label: EngineConfig(device="cuda", dtype="bfloat16", token_budget=16384,
                                   attention_in_o=o.attention_in_o) for label, o in OPTIONS.items()}
    configs["in_o-blocked128"] = configs["in_o"]  # the 128-token bucket's attention as the blocked loop
    engines = {label: Engine(spec, config, model=model) for label, config in configs.items()}
    check = PackedBatch.from_sequences(random_docs(np.array([16, 9, 30]), vocab, seed=5))
    first = None
    for label, engine in engines.items():
        small_attention.WHOLE_MAX_TOKENS = 64 if label == "in_o-blocked128" else 128  # read at capture
        for n in lengths:
            latency(engine, n, 5, vocab)  # capture each bucket now
        out = None
        for _ in range(3):
            out = engine.step(check).result()
        assert out is not None
        if first is None:
            first = out
        cos = float(((out * first).sum(1) / np.linalg.norm(out, axis=1) / np.linalg.norm(first, axis=1)).min())
        say(f"  engine {label}: cosine to pdl-only on a 3-sequence batch {cos:.6f}")
    small_attention.WHOLE_MAX_TOKENS = 128
    rows: dict[str, list[str]] = {}
    for _ in range(2):
        for label, engine in engines.items():
            for n in lengths:
                cell = latency(engine, n, 400, vocab)
                rows.setdefault(label, []).append(f"{n}: {cell['p50_ms']:.3f}/{cell['p99_ms']:.3f}")
    say("\nengine L1 pplx-embed-0.6b, p50/p99 ms, two rounds taking turns")
    for label, cells in rows.items():
        say(f"  {label:<15} " + " | ".join(cells))


def main() -> None:
    sections = sys.argv[1:] or ["check", "ceiling", "tiles", "whole", "engine"]
    torch.manual_seed(0)
    run_sections({"check": section_check, "ceiling": section_ceiling, "tiles": section_tiles, "whole": section_whole,
                  "engine": section_engine}, sections, SUMMARY)


if __name__ == "__main__":
    main()
