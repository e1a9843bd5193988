"""Does a tuned cuBLASLt algorithm beat cuBLAS's default pick for the throughput steps' GEMMs? On the GPU host.

    python3 bench/gemm_tune_probe.py [M ...]        (default: 16384 4096)

For each GEMM of a pplx-embed-0.6b (Qwen3) and a bge-m3 (XLM-R) layer, as the engine calls it (``F.linear``;
``linear_into_``: the residual added by the GEMM, beta 1; ``linear_gelu``: bias + GELU in cuBLASLt's
epilogue; ``F.linear`` with a bias), device microseconds a call inside a CUDA graph, first with PyTorch's
default (cuBLAS's heuristic pick), then with TunableOp (every cuBLAS/cuBLASLt candidate timed, the fastest
kept), the outputs of both compared. Then the sums per layer and per 28 / 24 layers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from petal.bench.gpu import graph_us_per_call
from petal.engine.layers.linear import Linear, linear_gelu, linear_into_

CUDA = torch.device("cuda")
BF16 = torch.bfloat16
COPIES = 4  # distinct inputs and weights in a graph


def linear(k: int, n: int, bias: bool) -> Linear:
    layer = Linear(k, n, bias=bias, device=CUDA, dtype=BF16)
    with torch.no_grad():
        layer.weight.copy_(torch.randn_like(layer.weight) * k**-0.5)
        if layer.bias is not None:
            layer.bias.copy_(torch.randn_like(layer.bias) * 0.1)
    return layer.requires_grad_(False)


# (model, name, K, N, kind): kind "mm" F.linear no bias, "bias" F.linear with bias, "into" linear_into_, "gelu"
GEMMS = [
    ("pplx", "qkv", 1024, 4096, "mm"),
    ("pplx", "o", 2048, 1024, "into"),
    ("pplx", "gate_up", 1024, 6144, "mm"),
    ("pplx", "down", 3072, 1024, "into"),
    ("bge-m3", "qkv", 1024, 3072, "bias"),
    ("bge-m3", "o", 1024, 1024, "into"),
    ("bge-m3", "up", 1024, 4096, "gelu"),
    ("bge-m3", "down", 4096, 1024, "into"),
]
LAYERS = {"pplx": 28, "bge-m3": 24}


def make_call(m: int, k: int, n: int, kind: str) -> tuple[Callable[[], object], Callable[[], torch.Tensor]]:
    layers = [linear(k, n, kind in ("bias", "gelu")) for _ in range(COPIES)]
    xs = [torch.randn(m, k, device=CUDA, dtype=BF16) for _ in range(COPIES)]
    residuals = [torch.randn(m, n, device=CUDA, dtype=BF16) for _ in range(COPIES)]

    def one(i: int) -> torch.Tensor:
        if kind == "into":
            return linear_into_(xs[i], layers[i], residuals[i])
        if kind == "gelu":
            return linear_gelu(xs[i], layers[i])
        return F.linear(xs[i], layers[i].weight, layers[i].bias)

    def all_copies() -> None:
        for i in range(COPIES):
            one(i)

    def sample() -> torch.Tensor:  # a fresh output for the comparison (the residual copied, not accumulated)
        if kind == "into":
            return linear_into_(xs[0], layers[0], torch.zeros(m, n, device=CUDA, dtype=BF16)).clone()
        return one(0).clone()

    return all_copies, sample


def main(ms: list[int]) -> None:
    tunable = torch.cuda.tunable
    print(f"torch {torch.__version__} | {torch.cuda.get_device_name(0)}", flush=True)
    rows = []
    for m in ms:
        for model, name, k, n, kind in GEMMS:
            torch.manual_seed(0)
            calls, sample = make_call(m, k, n, kind)
            tunable.enable(False)
            before = graph_us_per_call(calls, COPIES)
            ref = sample()
            tunable.enable(True)
            tunable.tuning_enable(True)
            tunable.set_max_tuning_duration(200)
            tunable.set_max_tuning_iterations(100)
            calls()  # tunes each new signature once
            torch.cuda.synchronize()
            tunable.tuning_enable(False)
            after = graph_us_per_call(calls, COPIES)
            got = sample()
            tunable.enable(False)
            diff = (got.float() - ref.float()).abs().max().item()
            tflops = 2 * m * k * n / after / 1e6
            rows.append((m, model, name, before, after))
            print(f"  M={m:6d} {model:7s} {name:8s} K={k:5d} N={n:5d} {kind:5s}: default {before:8.1f} us -> tuned "
                  f"{after:8.1f} us ({after / before:.3f}x, {tflops:.0f} TFLOP/s) max diff {diff:.3g}", flush=True)
            del calls, sample
            torch.cuda.empty_cache()
    for m in ms:
        for model, count in LAYERS.items():
            b = sum(r[3] for r in rows if r[0] == m and r[1] == model)
            a = sum(r[4] for r in rows if r[0] == m and r[1] == model)
            print(f"M={m} {model}: GEMMs a layer {b:.1f} -> {a:.1f} us ({a / b:.3f}x); x{count} layers "
                  f"{b * count / 1000:.2f} -> {a * count / 1000:.2f} ms")
    for entry in tunable.get_results():
        print("  tuned:", entry)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [16384, 4096])
