"""Large-bucket norms on the GPU host: FlashInfer's RMSNorm and petal's add + LayerNorm against Triton
variants that normalise several rows a program (16384 x 1024 bf16, 28 distinct inputs in one graph).

    python3 bench/norm_probe.py
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from petal.bench.gpu import graph_us_per_call

CUDA = torch.device("cuda")
BF16 = torch.bfloat16


@functools.cache
def kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def rms_rows(x_ptr, w_ptr, out_ptr, n_rows, eps, N: tl.constexpr, ROWS: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
        cols = tl.arange(0, N)[None, :]
        mask = rows < n_rows
        offs = rows.to(tl.int64) * N + cols
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
        w = tl.load(w_ptr + cols).to(tl.float32)
        tl.store(out_ptr + offs, (x * inv[:, None] * w).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def ln_rows(x_ptr, r_ptr, w_ptr, b_ptr, out_ptr, n_rows, eps, N: tl.constexpr, ROWS: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
        cols = tl.arange(0, N)[None, :]
        mask = rows < n_rows
        offs = rows.to(tl.int64) * N + cols
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32) + tl.load(r_ptr + cols).to(tl.float32)
        x = x.to(out_ptr.dtype.element_ty).to(tl.float32)
        mean = tl.sum(x, axis=1) / N
        c = x - mean[:, None]
        inv = 1.0 / tl.sqrt(tl.sum(c * c, axis=1) / N + eps)
        w = tl.load(w_ptr + cols).to(tl.float32)
        b = tl.load(b_ptr + cols).to(tl.float32)
        tl.store(out_ptr + offs, (c * inv[:, None] * w + b).to(out_ptr.dtype.element_ty), mask=mask)

    return rms_rows, ln_rows


def main() -> None:
    import flashinfer

    from petal.engine.layers.triton_kernels import add_layer_norm

    rms_rows, ln_rows = kernels()
    rows, hidden, layers = 16384, 1024, 28
    xs = [torch.randn(rows, hidden, device=CUDA, dtype=BF16) for _ in range(layers)]
    outs = [torch.empty_like(x) for x in xs]
    w = torch.rand(hidden, device=CUDA, dtype=BF16) + 0.5
    b = torch.randn(hidden, device=CUDA, dtype=BF16)
    gb = 2 * rows * hidden * 2 / 1e9
    ref = F.rms_norm(xs[0].float(), (hidden,), w.float(), 1e-6)
    base = graph_us_per_call(lambda: [flashinfer.rmsnorm(x, w, 1e-6) for x in xs], layers)
    print(f"rmsnorm flashinfer: {base:.2f} us ({gb / base * 1e3:.2f} TB/s)")
    for r in (1, 2, 4, 8, 16):
        for warps in (4, 8, 16):
            def run(r: int = r, warps: int = warps) -> None:
                for x, o in zip(xs, outs):
                    rms_rows[(triton_cdiv(rows, r),)](x, w, o, rows, 1e-6, N=hidden, ROWS=r, num_warps=warps)
            us = graph_us_per_call(run, layers)
            run()
            err = float((outs[0].float() - ref).abs().max())
            print(f"rmsnorm triton rows {r:>2} warps {warps:>2}: {us:.2f} us ({gb / us * 1e3:.2f} TB/s, "
                  f"{us / base:.2f}x, max err {err:.3f})", flush=True)
    ln_ref = F.layer_norm(xs[0].float() + b.float(), (hidden,), w.float(), b.float(), 1e-12)
    base = graph_us_per_call(lambda: [add_layer_norm(x, b, w, b, 1e-12) for x in xs], layers)
    print(f"layernorm (bias row) today: {base:.2f} us ({gb / base * 1e3:.2f} TB/s)")
    for r in (1, 2, 4, 8, 16):
        for warps in (4, 8, 16):
            def run_ln(r: int = r, warps: int = warps) -> None:
                for x, o in zip(xs, outs):
                    ln_rows[(triton_cdiv(rows, r),)](x, b, w, b, o, rows, 1e-12, N=hidden, ROWS=r, num_warps=warps)
            us = graph_us_per_call(run_ln, layers)
            run_ln()
            err = float((outs[0].float() - ln_ref).abs().max())
            print(f"layernorm triton rows {r:>2} warps {warps:>2}: {us:.2f} us ({gb / us * 1e3:.2f} TB/s, "
                  f"{us / base:.2f}x, max err {err:.3f})", flush=True)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
