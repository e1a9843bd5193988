"""Throughput buckets: Qwen3's gate/up GEMM with SwiGLU in the epilogue as a Hopper TMA kernel, on the GPU host.

    python3 bench/swiglu_tma_probe.py [ROWS ... | engine]      (default: 16384 4096)

The eighth round's fused Triton kernel (the small-batch path's ``gate_up_silu``) lost to cuBLAS +
``silu_and_mul`` at large buckets (411.5 against 380.7 us a layer at 16384 rows): it loads its tiles with
pointer arithmetic. This probe asks whether a kernel that loads with TMA descriptors (and, as a variant,
stays resident over many tiles) gets near cuBLAS's GEMM while dropping the ``[T, 2 * inter]`` round trip
and the separate activation kernel. Device time per layer inside CUDA graphs of 28 layers with distinct
weights and inputs (pplx-embed-0.6b shape: hidden 1024, intermediate 3072), against:

- ``gemm``: cuBLAS's gate/up GEMM alone (the ceiling for any fused form);
- ``unfused``: cuBLAS + FlashInfer's ``silu_and_mul`` (what the engine runs today).

Variants: ``tma`` (one program a tile), ``persist`` (one program an SM walking tiles), ``inter`` (weights
interleaved in blocks of ``BN`` gate rows then ``BN`` up rows, so one ``BM x 2BN`` dot per K step).
The rounding matches the unfused path: both GEMM outputs rounded to bf16 before the activation.
``engine``: T1 / T2 of pplx-embed-0.6b with the engine's TMA kernel (``engine/layers/tma_mlp.py``) and without.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from petal.bench.gpu import graph_us_per_call

CUDA = torch.device("cuda")
BF16 = torch.bfloat16
HIDDEN, INTER, LAYERS = 1024, 3072, 28


@triton.jit
def _tile_pid(tile, num_m, num_n, GROUP_M: tl.constexpr):
    per_group = GROUP_M * num_n
    group = tile // per_group
    first_m = group * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (tile % per_group) % size_m
    pid_n = (tile % per_group) // size_m
    return pid_m, pid_n


@triton.jit
def _swiglu_tile(x_desc, w_desc, o_desc, pid_m, pid_n, K, INTER_N, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, INTERLEAVED: tl.constexpr):
    off_m = pid_m * BM
    off_n = pid_n * BN
    if INTERLEAVED:
        acc = tl.zeros((BM, 2 * BN), dtype=tl.float32)
        for k in range(0, K, BK):
            a = x_desc.load([off_m, k])
            w = w_desc.load([2 * off_n, k])
            acc = tl.dot(a, w.T, acc)
        gate, up = acc.reshape(BM, 2, BN).permute(0, 2, 1).split()
    else:
        gate = tl.zeros((BM, BN), dtype=tl.float32)
        up = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            a = x_desc.load([off_m, k])
            g = w_desc.load([off_n, k])
            u = w_desc.load([INTER_N + off_n, k])
            gate = tl.dot(a, g.T, gate)
            up = tl.dot(a, u.T, up)
    gate = gate.to(tl.bfloat16).to(tl.float32)
    up = up.to(tl.bfloat16).to(tl.float32)
    out = (gate / (1.0 + tl.exp(-gate)) * up).to(tl.bfloat16)
    o_desc.store([off_m, off_n], out)


@triton.jit
def swiglu_tma_kernel(x_desc, w_desc, o_desc, M, K, INTER_N, BM: tl.constexpr, BN: tl.constexpr,
                      BK: tl.constexpr, GROUP_M: tl.constexpr, INTERLEAVED: tl.constexpr):
    num_m = tl.cdiv(M, BM)
    num_n = INTER_N // BN
    pid_m, pid_n = _tile_pid(tl.program_id(0), num_m, num_n, GROUP_M)
    _swiglu_tile(x_desc, w_desc, o_desc, pid_m, pid_n, K, INTER_N, BM, BN, BK, INTERLEAVED)


@triton.jit
def swiglu_persistent_kernel(x_desc, w_desc, o_desc, M, K, INTER_N, NUM_PROGRAMS: tl.constexpr,
                             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                             INTERLEAVED: tl.constexpr):
    num_m = tl.cdiv(M, BM)
    num_n = INTER_N // BN
    for tile in range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS):
        pid_m, pid_n = _tile_pid(tile, num_m, num_n, GROUP_M)
        _swiglu_tile(x_desc, w_desc, o_desc, pid_m, pid_n, K, INTER_N, BM, BN, BK, INTERLEAVED)


def interleave(weight: torch.Tensor, block_n: int) -> torch.Tensor:
    """``[gate | up]`` rows -> blocks of ``block_n`` gate rows followed by the matching ``block_n`` up rows."""
    inter = weight.shape[0] // 2
    gate, up = weight[:inter], weight[inter:]
    blocks = torch.stack([gate.reshape(-1, block_n, weight.shape[1]), up.reshape(-1, block_n, weight.shape[1])], 1)
    return blocks.reshape(weight.shape).contiguous()


def swiglu(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, cfg: tuple, variant: str) -> None:
    bm, bn, bk, stages, warps, group = cfg
    rows = x.shape[0]
    interleaved = variant == "inter"
    x_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    w_desc = TensorDescriptor.from_tensor(weight, [2 * bn if interleaved else bn, bk])
    o_desc = TensorDescriptor.from_tensor(out, [bm, bn])
    tiles = triton.cdiv(rows, bm) * (INTER // bn)
    if variant == "tma":
        swiglu_tma_kernel[(tiles,)](x_desc, w_desc, o_desc, rows, HIDDEN, INTER, BM=bm, BN=bn, BK=bk,
                                    GROUP_M=group, INTERLEAVED=False, num_stages=stages, num_warps=warps)
    else:
        programs = min(tiles, torch.cuda.get_device_properties(0).multi_processor_count)
        swiglu_persistent_kernel[(programs,)](x_desc, w_desc, o_desc, rows, HIDDEN, INTER, NUM_PROGRAMS=programs,
                                              BM=bm, BN=bn, BK=bk, GROUP_M=group, INTERLEAVED=interleaved,
                                              num_stages=stages, num_warps=warps)


CONFIGS = [  # BM, BN, BK, stages, warps, group
    (128, 128, 64, 3, 8, 8), (128, 128, 64, 4, 8, 8), (128, 64, 64, 4, 4, 8), (128, 64, 64, 5, 8, 8),
    (128, 128, 128, 2, 8, 8), (64, 128, 64, 4, 4, 8), (128, 64, 128, 3, 8, 8), (128, 128, 64, 3, 8, 1),
]


def row(rows: int) -> None:
    from petal.engine.layers.activation import silu_and_mul

    torch.manual_seed(3)
    weights = [torch.randn(2 * INTER, HIDDEN, device=CUDA, dtype=BF16) * HIDDEN**-0.5 for _ in range(LAYERS)]
    xs = [torch.randn(rows, HIDDEN, device=CUDA, dtype=BF16) for _ in range(LAYERS)]
    outs = [torch.empty(rows, INTER, device=CUDA, dtype=BF16) for _ in range(LAYERS)]
    ref = silu_and_mul(F.linear(xs[0], weights[0])).float()
    flops = 2 * rows * HIDDEN * 2 * INTER

    def gemm() -> None:
        for i in range(LAYERS):
            F.linear(xs[i], weights[i])

    def unfused() -> None:
        for i in range(LAYERS):
            silu_and_mul(F.linear(xs[i], weights[i]))

    gemm_us = graph_us_per_call(gemm, LAYERS)
    base_us = graph_us_per_call(unfused, LAYERS)
    print(f"rows {rows}: cuBLAS GEMM alone {gemm_us:.1f} us ({flops / gemm_us / 1e6:.0f} TFLOP/s); "
          f"cuBLAS + silu_and_mul {base_us:.1f} us", flush=True)
    cells: list[tuple[float, str, tuple, float]] = []
    # NOTE: PROBE_VARIANTS / PROBE_CONFIGS (indices into CONFIGS) narrow a run
    variants = os.environ.get("PROBE_VARIANTS", "tma,persist,inter").split(",")
    picked = [CONFIGS[int(i)] for i in os.environ.get("PROBE_CONFIGS", "").split(",") if i] or CONFIGS
    for variant in variants:
        for cfg in picked:
            ws = weights if variant != "inter" else [interleave(w, cfg[1]) for w in weights]
            try:
                swiglu(xs[0], ws[0], outs[0], cfg, variant)
                err = float((outs[0].float() - ref).abs().max())

                def fused(ws: list[torch.Tensor] = ws, cfg: tuple = cfg, variant: str = variant) -> None:
                    for i in range(LAYERS):
                        swiglu(xs[i], ws[i], outs[i], cfg, variant)

                us = graph_us_per_call(fused, LAYERS)
            except Exception as exc:  # a config that does not compile or fit in shared memory
                print(f"  {variant} {cfg}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                continue
            cells.append((us, variant, cfg, err))
            print(f"  {variant:8s} {cfg}: {us:7.1f} us ({flops / us / 1e6:4.0f} TFLOP/s) "
                  f"{us / base_us:.3f}x unfused, max err {err:.4f}", flush=True)
            del ws
    cells.sort()
    print(f"rows {rows} best: " + "; ".join(f"{v} {c} {us:.1f} us ({us / base_us:.3f}x unfused, "
                                             f"{us / gemm_us:.3f}x GEMM)" for us, v, c, _ in cells[:4]), flush=True)


def engine_ab(rounds: int = 3) -> None:
    """``petal bench gpu``'s T1 (512-token docs) and T2 (lognormal) of pplx-embed-0.6b under engines with the
    TMA kernel from ``EngineConfig.tma_mlp_tokens`` (default) and without it (0), taking turns; vectors of
    each against Hugging Face's (same weights) and against each other."""
    import numpy as np

    from petal.bench.corpus import lognormal_lengths
    from petal.bench.gpu import cosine_rows, hf_throughput, petal_throughput, random_docs
    from petal.bench.shapes import hf_model, native_from_hf, shape
    from petal.engine.config import EngineConfig
    from petal.engine.engine import Engine

    s = shape("pplx-embed-0.6b")
    hf = hf_model(s, CUDA, BF16)
    spec, model = native_from_hf(s, hf, CUDA, BF16)
    vocab = spec.config.vocab_size
    t1 = random_docs(np.full(1024, 512), vocab, seed=1)
    t2 = random_docs(lognormal_lengths(4096, 150, 0.8, 8, 512, seed=0), vocab, seed=2)
    bidirectional = not spec.config.causal
    _, hf_vectors = hf_throughput(hf, s, t2[:512], sort=True, bidirectional=bidirectional)
    del hf
    torch.cuda.empty_cache()
    variants = {"tma": EngineConfig().tma_mlp_tokens, "off": 0}
    engines = {name: Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=16384,
                                               tma_mlp_tokens=tokens), model=model)
               for name, tokens in variants.items()}
    print("engines: " + ", ".join(f"{n} tma_mlp_tokens={e.small.tma_mlp_tokens}" for n, e in engines.items()))
    for engine in engines.values():  # every bucket: eager + capture
        petal_throughput(engine, t1[:128])
        petal_throughput(engine, t2[:1024])
    cells: dict[str, dict[str, list[float]]] = {name: {"t1": [], "t2": []} for name in engines}
    vectors: dict[str, np.ndarray] = {}
    for turn in range(rounds):
        order = list(engines) if turn % 2 == 0 else list(engines)[::-1]
        for name in order:
            seconds, _ = petal_throughput(engines[name], t1)
            cells[name]["t1"].append(sum(map(len, t1)) / seconds)
            seconds, vectors[name] = petal_throughput(engines[name], t2)
            cells[name]["t2"].append(sum(map(len, t2)) / seconds)
    for name in engines:
        cos_hf = cosine_rows(vectors[name][:512], hf_vectors)
        print(f"  {name}: T1 " + "/".join(f"{v / 1e3:.0f}k" for v in cells[name]["t1"]) + " T2 "
              + "/".join(f"{v / 1e3:.0f}k" for v in cells[name]["t2"])
              + f" tok/s | cos vs HF min {cos_hf.min():.6f}", flush=True)
    cos = cosine_rows(vectors["tma"], vectors["off"])
    print("  tma/off: " + " ".join(f"{k} {np.median(cells['tma'][k]) / np.median(cells['off'][k]):.3f}x"
                                    for k in ("t1", "t2")) + f" | cos tma vs off min {cos.min():.6f}", flush=True)


def main() -> None:
    print(f"triton {triton.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    args = sys.argv[1:] or ["16384", "4096"]
    for arg in args:
        if arg == "engine":
            with torch.inference_mode():
                engine_ab()
            continue
        with torch.inference_mode():
            row(int(arg))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
