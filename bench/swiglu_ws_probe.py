"""Throughput buckets: can Triton's warp specialization bring the TMA gate/up + SwiGLU kernel to cuBLAS's speed?

    python3 bench/swiglu_ws_probe.py [sweep] [ROWS ...]      (default: 16384 4096)

The engine's kernel (``engine/layers/tma_mlp.py``: persistent, host-side TMA descriptors, no warp
specialization) takes ~367 us a layer at 16384 rows where cuBLAS's gate/up GEMM alone takes ~330 us: the SwiGLU
it fuses is nearly free, the GEMM under it is ~10% slower than cuBLAS's. Hopper warp specialization in Triton
(a producer warp issuing the TMA loads, consumer warp groups running the MMAs, the epilogue of one tile
overlapping the next tile's loads) needs device-side descriptors (``tl.make_tensor_descriptor``) and
``tl.range(..., warp_specialize=True)`` on the tile loop. Variants: device-side descriptors with and without
warp specialization and with and without ``flatten``, over a few tile shapes; device time per layer inside
CUDA graphs of 28 layers with distinct weights and inputs (pplx-embed-0.6b shape), against cuBLAS's GEMM alone,
cuBLAS + ``silu_and_mul`` and the engine's kernel, with each variant's output checked against the engine's.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from petal.bench.gpu import graph_us_per_call

CUDA = torch.device("cuda")
BF16 = torch.bfloat16
HIDDEN, INTER, LAYERS = 1024, 3072, 28


@triton.jit
def _ws_kernel(x_ptr, w_ptr, o_ptr, num_tokens, NUM_PROGRAMS: tl.constexpr, K: tl.constexpr,
               INTER_N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               GROUP_M: tl.constexpr, WS: tl.constexpr, FLATTEN: tl.constexpr):
    x_desc = tl.make_tensor_descriptor(x_ptr, shape=[num_tokens, K], strides=[K, 1], block_shape=[BM, BK])
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[2 * INTER_N, K], strides=[K, 1], block_shape=[BN, BK])
    o_desc = tl.make_tensor_descriptor(o_ptr, shape=[num_tokens, INTER_N], strides=[INTER_N, 1],
                                       block_shape=[BM, BN])
    num_m = tl.cdiv(num_tokens, BM)
    num_n: tl.constexpr = INTER_N // BN
    per_group: tl.constexpr = GROUP_M * num_n
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS, flatten=FLATTEN, warp_specialize=WS):
        first_m = (tile // per_group) * GROUP_M
        size_m = min(num_m - first_m, GROUP_M)
        off_m = (first_m + (tile % per_group) % size_m) * BM
        off_n = ((tile % per_group) // size_m) * BN
        gate = tl.zeros((BM, BN), dtype=tl.float32)
        up = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            a = x_desc.load([off_m, k])
            gate = tl.dot(a, w_desc.load([off_n, k]).T, gate)
            up = tl.dot(a, w_desc.load([INTER_N + off_n, k]).T, up)
        gate = gate.to(tl.bfloat16).to(tl.float32)
        up = up.to(tl.bfloat16).to(tl.float32)
        o_desc.store([off_m, off_n], (gate / (1.0 + tl.exp(-gate)) * up).to(tl.bfloat16))


@triton.jit
def _host_const_kernel(x_desc, w_desc, o_desc, num_tokens, NUM_PROGRAMS: tl.constexpr, K: tl.constexpr,
                       INTER_N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       GROUP_M: tl.constexpr):
    num_m = tl.cdiv(num_tokens, BM)
    num_n: tl.constexpr = INTER_N // BN
    per_group: tl.constexpr = GROUP_M * num_n
    for tile in range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS):
        first_m = (tile // per_group) * GROUP_M
        size_m = min(num_m - first_m, GROUP_M)
        off_m = (first_m + (tile % per_group) % size_m) * BM
        off_n = ((tile % per_group) // size_m) * BN
        gate = tl.zeros((BM, BN), dtype=tl.float32)
        up = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            a = x_desc.load([off_m, k])
            gate = tl.dot(a, w_desc.load([off_n, k]).T, gate)
            up = tl.dot(a, w_desc.load([INTER_N + off_n, k]).T, up)
        gate = gate.to(tl.bfloat16).to(tl.float32)
        up = up.to(tl.bfloat16).to(tl.float32)
        o_desc.store([off_m, off_n], (gate / (1.0 + tl.exp(-gate)) * up).to(tl.bfloat16))


def host_const_call(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, cfg: tuple) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, stages, warps, group = cfg
    rows = x.shape[0]
    tiles = triton.cdiv(rows, bm) * (INTER // bn)
    programs = min(tiles, torch.cuda.get_device_properties(0).multi_processor_count)
    descs = (TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
             TensorDescriptor.from_tensor(out, [bm, bn]))
    _host_const_kernel[(programs,)](*descs, rows, NUM_PROGRAMS=programs, K=HIDDEN,
                                    INTER_N=INTER, BM=bm, BN=bn, BK=bk, GROUP_M=group, num_stages=stages,
                                    num_warps=warps)


def _alloc(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, device=CUDA, dtype=torch.int8)


def ws_call(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, cfg: tuple, ws: bool, flatten: bool) -> None:
    bm, bn, bk, stages, warps, group = cfg
    rows = x.shape[0]
    tiles = triton.cdiv(rows, bm) * (INTER // bn)
    programs = min(tiles, torch.cuda.get_device_properties(0).multi_processor_count)
    _ws_kernel[(programs,)](x, w, out, rows, NUM_PROGRAMS=programs, K=HIDDEN, INTER_N=INTER, BM=bm, BN=bn, BK=bk,
                            GROUP_M=group, WS=ws, FLATTEN=flatten, num_stages=stages, num_warps=warps)


CONFIGS = [  # BM, BN, BK, stages, warps, group
    (128, 128, 64, 3, 8, 8), (128, 128, 64, 4, 8, 8), (128, 64, 64, 4, 4, 8), (128, 64, 64, 4, 8, 8),
    (128, 128, 64, 3, 4, 8),
]


def row(rows: int, sweep: bool) -> None:
    from petal.engine.layers.activation import silu_and_mul
    from petal.engine.layers.tma_mlp import gate_up_silu_tma

    torch.manual_seed(3)
    weights = [torch.randn(2 * INTER, HIDDEN, device=CUDA, dtype=BF16) * HIDDEN**-0.5 for _ in range(LAYERS)]
    xs = [torch.randn(rows, HIDDEN, device=CUDA, dtype=BF16) for _ in range(LAYERS)]
    outs = [torch.empty(rows, INTER, device=CUDA, dtype=BF16) for _ in range(LAYERS)]
    ref = gate_up_silu_tma(xs[0], weights[0])
    flops = 2 * rows * HIDDEN * 2 * INTER

    def gemm() -> None:
        for i in range(LAYERS):
            F.linear(xs[i], weights[i])

    def unfused() -> None:
        for i in range(LAYERS):
            silu_and_mul(F.linear(xs[i], weights[i]))

    def engine() -> None:
        for i in range(LAYERS):
            gate_up_silu_tma(xs[i], weights[i])

    gemm_us = graph_us_per_call(gemm, LAYERS)
    base_us = graph_us_per_call(unfused, LAYERS)
    engine_us = graph_us_per_call(engine, LAYERS)
    print(f"rows {rows}: cuBLAS GEMM alone {gemm_us:.1f} us ({flops / gemm_us / 1e6:.0f} TFLOP/s); cuBLAS + "
          f"silu_and_mul {base_us:.1f}; engine TMA kernel {engine_us:.1f} ({engine_us / gemm_us:.3f}x GEMM)",
          flush=True)
    if sweep:  # device-side descriptors, warp specialization and flatten on and off, every tile shape
        variants = [("device", ws, flatten, cfg)
                    for ws in (False, True) for flatten in (False, True) for cfg in CONFIGS]
    else:  # what makes the device-descriptor kernel faster: the descriptors, or the program count as a constant?
        variants = [("host-const", False, False, cfg) for cfg in CONFIGS[:2]]
        variants += [("device", False, False, cfg) for cfg in CONFIGS[:2]]
    for kind, ws, flatten, cfg in variants:
        name = f"{kind} ws={int(ws)} flatten={int(flatten)} {cfg}"

        def call(i: int, kind: str = kind, cfg: tuple = cfg, ws: bool = ws, flatten: bool = flatten) -> None:
            if kind == "host-const":
                host_const_call(xs[i], weights[i], outs[i], cfg)
            else:
                ws_call(xs[i], weights[i], outs[i], cfg, ws, flatten)

        try:
            call(0)
            same = bool(torch.equal(outs[0], ref))

            def fused(call=call) -> None:
                for i in range(LAYERS):
                    call(i)

            us = graph_us_per_call(fused, LAYERS)
        except Exception as exc:
            print(f"  {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        print(f"  {name}: {us:7.1f} us ({us / engine_us:.3f}x engine, {us / gemm_us:.3f}x GEMM) equal {same}",
              flush=True)
    again = graph_us_per_call(engine, LAYERS)
    print(f"  engine kernel again: {again:.1f} us", flush=True)


def main() -> None:
    print(f"triton {triton.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    triton.set_allocator(_alloc)
    args = sys.argv[1:]
    sweep = "sweep" in args
    for arg in [a for a in args if a != "sweep"] or ["16384", "4096"]:
        with torch.inference_mode():
            row(int(arg), sweep)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
