"""What is left of a T1 step besides GEMMs: three candidates measured on the GPU host.

    python3 bench/t1_parts_probe.py [fold] [qkrope] [gemm]      (default: all three)

Device time per layer inside CUDA graphs of 28 layers with distinct weights and inputs (pplx-embed-0.6b shape:
hidden 1024, intermediate 3072, 16 q / 8 kv heads of 128), at 16384 and 4096 rows:

- ``fold``: the post-attention RMSNorm folded into the TMA gate/up + SwiGLU kernel (``engine/layers/tma_mlp.py``),
  against today's RMSNorm kernel followed by that kernel. Variants: ``reg`` (sum of squares over the K loop's
  ``x`` tiles; ``x * g`` in registers; the row scale on the accumulators), ``w`` (the same with ``g`` folded
  into a copy of the weights, so the ``x`` tile goes to the tensor cores untouched), ``sep`` (a small kernel
  writes each row's ``1 / rms``; the GEMM scales rows in its epilogue, weights with ``g``), ``pre`` (a first
  pass over the row block for ``1 / rms``, then ``x * rstd * g`` rounded as the norm kernel rounds).
- ``qkrope``: the in-place q/k RMSNorm + RoPE kernel with 1 (today), 2, 4 or 8 tokens a program.
- ``gemm``: the four GEMMs under cuBLAS and cuBLASLt, and how many memset nodes a captured GEMM adds.
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from petal.bench.gpu import graph_us_per_call

CUDA = torch.device("cuda")
BF16 = torch.bfloat16
HIDDEN, INTER, LAYERS, EPS = 1024, 3072, 28, 1e-6
Q_HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
BM, BN, BK, STAGES, WARPS, GROUP_M = 128, 128, 64, 3, 8, 8


@triton.jit
def _fold_kernel(x_desc, w_desc, o_desc, g_ptr, rstd_ptr, eps, num_tokens, num_programs, K: tl.constexpr,
                 INTER_N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 GROUP_M: tl.constexpr, MODE: tl.constexpr):
    # MODE 0 reg, 1 w, 2 sep, 3 pre
    num_m = tl.cdiv(num_tokens, BM)
    num_n: tl.constexpr = INTER_N // BN
    per_group: tl.constexpr = GROUP_M * num_n
    for tile in range(tl.program_id(0), num_m * num_n, num_programs):
        first_m = (tile // per_group) * GROUP_M
        size_m = min(num_m - first_m, GROUP_M)
        off_m = (first_m + (tile % per_group) % size_m) * BM
        off_n = ((tile % per_group) // size_m) * BN
        gate = tl.zeros((BM, BN), dtype=tl.float32)
        up = tl.zeros((BM, BN), dtype=tl.float32)
        sumsq = tl.zeros((BM,), dtype=tl.float32)
        rstd = tl.zeros((BM,), dtype=tl.float32)
        if MODE == 3:
            for k in range(0, K, BK):
                af = x_desc.load([off_m, k]).to(tl.float32)
                sumsq += tl.sum(af * af, axis=1)
            rstd = 1.0 / tl.sqrt(sumsq / K + eps)
        for k in range(0, K, BK):
            a = x_desc.load([off_m, k])
            if MODE == 0:
                af = a.to(tl.float32)
                sumsq += tl.sum(af * af, axis=1)
                gk = tl.load(g_ptr + k + tl.arange(0, BK)).to(tl.float32)
                a = (af * gk[None, :]).to(tl.bfloat16)
            elif MODE == 1:
                af = a.to(tl.float32)
                sumsq += tl.sum(af * af, axis=1)
            elif MODE == 3:
                gk = tl.load(g_ptr + k + tl.arange(0, BK)).to(tl.float32)
                a = (a.to(tl.float32) * rstd[:, None] * gk[None, :]).to(tl.bfloat16)
            gate = tl.dot(a, w_desc.load([off_n, k]).T, gate)
            up = tl.dot(a, w_desc.load([INTER_N + off_n, k]).T, up)
        if MODE == 0 or MODE == 1:
            rstd = 1.0 / tl.sqrt(sumsq / K + eps)
        if MODE == 2:
            rows = off_m + tl.arange(0, BM)
            rstd = tl.load(rstd_ptr + rows, mask=rows < num_tokens, other=0.0)
        if MODE != 3:
            gate = gate * rstd[:, None]
            up = up * rstd[:, None]
        gate = gate.to(tl.bfloat16).to(tl.float32)
        up = up.to(tl.bfloat16).to(tl.float32)
        o_desc.store([off_m, off_n], (gate / (1.0 + tl.exp(-gate)) * up).to(tl.bfloat16))


@triton.jit
def _rstd_kernel(x_ptr, out_ptr, num_tokens, eps, K: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, K)
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=rows[:, None] < num_tokens,
                other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / K + eps), mask=rows < num_tokens)


MODES = {"reg": 0, "w": 1, "sep": 2, "pre": 3}


def fold_call(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, out: torch.Tensor, rstd: torch.Tensor,
              mode: str) -> None:
    rows = x.shape[0]
    if mode == "sep":
        _rstd_kernel[(triton.cdiv(rows, 4),)](x, rstd, rows, EPS, K=HIDDEN, ROWS=4, num_warps=4)
    tiles = triton.cdiv(rows, BM) * (INTER // BN)
    programs = min(tiles, torch.cuda.get_device_properties(0).multi_processor_count)
    _fold_kernel[(programs,)](TensorDescriptor.from_tensor(x, [BM, BK]), TensorDescriptor.from_tensor(w, [BN, BK]),
                              TensorDescriptor.from_tensor(out, [BM, BN]), g, rstd, EPS, rows, programs, K=HIDDEN,
                              INTER_N=INTER, BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M, MODE=MODES[mode],
                              num_stages=STAGES, num_warps=WARPS)


def cos_min(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=1).min())


def fold(rows: int) -> None:
    from petal.engine.layers.norm import RMSNorm
    from petal.engine.layers.tma_mlp import gate_up_silu_tma

    torch.manual_seed(5)
    weights = [torch.randn(2 * INTER, HIDDEN, device=CUDA, dtype=BF16) * HIDDEN**-0.5 for _ in range(LAYERS)]
    norms = []
    for _ in range(LAYERS):
        norm = RMSNorm(HIDDEN, EPS).to(CUDA, BF16)
        norm.weight.data = (1 + 0.3 * torch.randn(HIDDEN, device=CUDA)).to(BF16)
        norms.append(norm)
    scaled = [(w.float() * n.weight.float()[None, :]).to(BF16).contiguous() for w, n in zip(weights, norms)]
    xs = [torch.randn(rows, HIDDEN, device=CUDA, dtype=BF16) * 3 for _ in range(LAYERS)]
    outs = [torch.empty(rows, INTER, device=CUDA, dtype=BF16) for _ in range(LAYERS)]
    rstds = [torch.empty(rows, device=CUDA, dtype=torch.float32) for _ in range(LAYERS)]
    ref = gate_up_silu_tma(norms[0](xs[0]), weights[0])
    # float32 reference of HF's rounding: bf16(x * rstd) * g -> bf16, GEMM in float32
    x32 = xs[0].float()
    normed = (norms[0].weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)).to(BF16)).float()
    prod = normed @ weights[0].float().T
    exact = (torch.nn.functional.silu(prod[:, :INTER]) * prod[:, INTER:])

    def base() -> None:
        for i in range(LAYERS):
            gate_up_silu_tma(norms[i](xs[i]), weights[i])

    def norm_only() -> None:
        for i in range(LAYERS):
            norms[i](xs[i])

    base_us = graph_us_per_call(base, LAYERS)
    norm_us = graph_us_per_call(norm_only, LAYERS)
    print(f"fold rows {rows}: RMSNorm + TMA kernel {base_us:.1f} us a layer (RMSNorm alone {norm_us:.1f}); "
          f"cos vs fp32 min {cos_min(ref, exact):.6f}", flush=True)
    for mode in MODES:
        ws = weights if mode in ("reg", "pre") else scaled
        try:
            fold_call(xs[0], ws[0], norms[0].weight, outs[0], rstds[0], mode)
            cos_base, cos_exact = cos_min(outs[0], ref), cos_min(outs[0], exact)
            rel = float((outs[0].float() - ref.float()).abs().max() / ref.float().abs().max())

            def fused(ws: list[torch.Tensor] = ws, mode: str = mode) -> None:
                for i in range(LAYERS):
                    fold_call(xs[i], ws[i], norms[i].weight, outs[i], rstds[i], mode)

            us = graph_us_per_call(fused, LAYERS)
        except Exception as exc:
            print(f"  {mode}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        print(f"  {mode:4s}: {us:7.1f} us a layer ({us / base_us:.3f}x RMSNorm + TMA); cos vs today min "
              f"{cos_base:.6f}, vs fp32 min {cos_exact:.6f}, max rel diff {rel:.4f}", flush=True)


@triton.jit
def _qk_rope_kernel(qkv_ptr, stride_t, pos_ptr, table_ptr, w_ptr, eps, num_tokens, Q_HEADS: tl.constexpr,
                    K_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, TOKENS: tl.constexpr):
    is_k = tl.program_id(1)
    heads = tl.where(is_k == 1, K_HEADS, Q_HEADS)
    col0 = is_k * (Q_HEADS * 2 * HALF)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, HALF)[None, :]
    w_row = w_ptr + is_k * (2 * HALF)
    w1 = tl.load(w_row + d).to(tl.float32)
    w2 = tl.load(w_row + HALF + d).to(tl.float32)
    for i in tl.static_range(TOKENS):
        token = tl.program_id(0) * TOKENS + i
        mask = (h < heads) & (token < num_tokens)
        base = qkv_ptr + token.to(tl.int64) * stride_t + col0 + h * (2 * HALF)
        x1 = tl.load(base + d, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(base + HALF + d, mask=mask, other=0.0).to(tl.float32)
        inv_rms = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
        x1 = x1 * inv_rms[:, None] * w1
        x2 = x2 * inv_rms[:, None] * w2
        pos = tl.load(pos_ptr + token, mask=token < num_tokens, other=0).to(tl.int64)
        cos = tl.load(table_ptr + pos * (2 * HALF) + d)
        sin = tl.load(table_ptr + pos * (2 * HALF) + HALF + d)
        out_ty = qkv_ptr.dtype.element_ty
        tl.store(base + d, (x1 * cos - x2 * sin).to(out_ty), mask=mask)
        tl.store(base + HALF + d, (x2 * cos + x1 * sin).to(out_ty), mask=mask)


def qkrope(rows: int) -> None:
    from petal.engine.layers.triton_kernels import qk_norm_rope_

    torch.manual_seed(6)
    width = (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM
    qkvs = [torch.randn(rows, width, device=CUDA, dtype=BF16) for _ in range(LAYERS)]
    positions = (torch.arange(rows, device=CUDA, dtype=torch.int32) % 512).contiguous()
    angles = torch.arange(4096, device=CUDA)[:, None] * (1e6 ** (-torch.arange(0, HEAD_DIM // 2, device=CUDA) /
                                                                    (HEAD_DIM // 2)))[None, :]
    table = torch.cat([angles.cos(), angles.sin()], 1).float().contiguous()
    weights = (1 + 0.2 * torch.randn(2, HEAD_DIM, device=CUDA)).to(BF16).contiguous()
    start = qkvs[0].clone()
    ref = start.clone()
    qk_norm_rope_(ref, positions, table, weights, EPS, Q_HEADS, KV_HEADS, HEAD_DIM)

    def today() -> None:
        for i in range(LAYERS):
            qk_norm_rope_(qkvs[i], positions, table, weights, EPS, Q_HEADS, KV_HEADS, HEAD_DIM)

    base_us = graph_us_per_call(today, LAYERS)
    moved = rows * (Q_HEADS + KV_HEADS) * HEAD_DIM * 2 * 2
    print(f"qkrope rows {rows}: today {base_us:.1f} us a layer ({moved / base_us / 1e6:.2f} TB/s)", flush=True)
    for tokens in (2, 4, 8):
        for warps in (4, 8):
            def call(qkv: torch.Tensor, tokens: int = tokens, warps: int = warps) -> None:
                _qk_rope_kernel[(triton.cdiv(rows, tokens), 2)](qkv, qkv.stride(0), positions, table, weights, EPS,
                                                                rows, Q_HEADS=Q_HEADS, K_HEADS=KV_HEADS,
                                                                HALF=HEAD_DIM // 2, BLOCK_H=16, TOKENS=tokens,
                                                                num_warps=warps)
            got = start.clone()
            call(got)
            same = bool(torch.equal(got, ref))

            def many(call=call) -> None:
                for i in range(LAYERS):
                    call(qkvs[i])

            us = graph_us_per_call(many, LAYERS)
            print(f"  {tokens} tokens, {warps} warps: {us:6.1f} us ({us / base_us:.3f}x), equal {same}", flush=True)


def node_types(run) -> tuple[float, float]:
    """Memset and kernel nodes of ``run`` captured (libcudart's ``cudaGraphGetNodes``); NaN where unavailable."""
    import ctypes
    import glob

    try:
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph):
            run()
        handle = ctypes.c_void_p(graph.raw_cuda_graph())
        paths = [p for p in glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "**",
                                                   "libcudart.so*"), recursive=True)]
        lib = ctypes.CDLL(paths[0] if paths else "libcudart.so")
        count = ctypes.c_size_t(0)
        lib.cudaGraphGetNodes(handle, None, ctypes.byref(count))
        nodes = (ctypes.c_void_p * count.value)()
        lib.cudaGraphGetNodes(handle, nodes, ctypes.byref(count))
        kinds = []
        for node in nodes:
            kind = ctypes.c_int(-1)
            lib.cudaGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind))
            kinds.append(kind.value)
        return float(kinds.count(2)), float(kinds.count(0))  # cudaGraphNodeTypeMemset, ...Kernel
    except Exception as exc:
        print(f"  (node count unavailable: {type(exc).__name__}: {exc})", flush=True)
        return float("nan"), float("nan")


def gemm(rows: int) -> None:
    torch.manual_seed(7)
    shapes = {"qkv": (HIDDEN, (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM), "o": (Q_HEADS * HEAD_DIM, HIDDEN),
              "gate_up": (HIDDEN, 2 * INTER), "down": (INTER, HIDDEN)}
    for name, (k, n) in shapes.items():
        ws = [torch.randn(n, k, device=CUDA, dtype=BF16) for _ in range(LAYERS)]
        xs = [torch.randn(rows, k, device=CUDA, dtype=BF16) for _ in range(LAYERS)]
        res = [torch.randn(rows, n, device=CUDA, dtype=BF16) for _ in range(LAYERS)]
        cells = []
        for lib in ("cublas", "cublaslt"):
            torch.backends.cuda.preferred_blas_library(lib)
            into = name in ("o", "down")

            def run(ws=ws, xs=xs, res=res, into=into) -> None:
                for i in range(LAYERS):
                    if into:
                        res[i].addmm_(xs[i], ws[i].t())
                    else:
                        torch.nn.functional.linear(xs[i], ws[i])

            us = graph_us_per_call(run, LAYERS)
            memsets, kernels = node_types(run)
            flops = 2 * rows * k * n
            cells.append(f"{lib} {us:.1f} us ({flops / us / 1e6:.0f} TFLOP/s), {kernels / LAYERS:.1f} kernels + "
                         f"{memsets / LAYERS:.1f} memsets a GEMM")
        torch.backends.cuda.preferred_blas_library("cublas")
        print(f"gemm {name} rows {rows}{' (+residual)' if name in ('o', 'down') else ''}: " + "; ".join(cells),
              flush=True)


def main() -> None:
    print(f"triton {triton.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    sections = sys.argv[1:] or ["fold", "qkrope", "gemm"]
    table = {"fold": fold, "qkrope": qkrope, "gemm": gemm}
    for name in sections:
        for rows in (16384, 4096):
            try:
                with torch.inference_mode():
                    table[name](rows)
            except Exception as exc:
                import traceback
                traceback.print_exc()
                print(f"{name} {rows}: failed: {exc}", flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
