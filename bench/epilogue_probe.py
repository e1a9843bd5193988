"""Work moved into the GEMMs (``EngineConfig.gemm_epilogues``: residual adds, BERT's GELU), on the GPU host.

    python3 bench/epilogue_probe.py [SECTION ...]      (default: check layer engine)

- ``check``: the three pieces against float32 references: the up projection with bias + GELU in
  cuBLASLt's epilogue (``linear_gelu``: tanh GELU) against the erf and the tanh GELU, the residual added
  by the GEMM (``linear_into_``), and the LayerNorm that adds one bias row (``add_layer_norm``).
- ``layer``: device time per layer inside CUDA graphs (24 / 6 layers' distinct weights and inputs, so
  reads come from HBM) of a BERT layer's work around attention -- O GEMM + add + LayerNorm, up GEMM +
  GELU, down GEMM + add + LayerNorm -- unfused, with the GELU epilogue, and with the residual adds in
  the GEMMs too; at 16384, 2048, 128 and 16 rows, bge-m3 and MiniLM shapes.
- ``swiglu``: Qwen3's gate/up GEMM + SwiGLU at 16384 and 4096 rows: cuBLAS + ``silu_and_mul`` against the
  fused Triton kernel of the small-batch path over tile candidates.
- ``engine`` (bge-m3, MiniLM) / ``engine_qwen3`` (pplx-embed-0.6b): ``petal bench gpu``'s T1 (512-token
  docs), T2 (lognormal) and L1 (16 / 128 tokens) of one
  model under two engines, epilogues off and on, taking turns (off, on, off, on); the vectors of each
  against Hugging Face's (same weights) and against each other.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from petal.bench.corpus import lognormal_lengths
from petal.bench.gpu import cosine_rows, graph_us_per_call, hf_throughput, latency, petal_throughput, random_docs
from petal.bench.shapes import hf_model, native_from_hf, shape
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine
from petal.engine.layers.linear import Linear, linear_gelu, linear_into_
from petal.engine.layers.triton_kernels import add_layer_norm

CUDA = torch.device("cuda")
BF16 = torch.bfloat16
SUMMARY: list[str] = []


def say(line: str) -> None:
    print(line, flush=True)
    SUMMARY.append(line)


def linear(in_features: int, out_features: int, dtype: torch.dtype = BF16) -> Linear:
    layer = Linear(in_features, out_features, device=CUDA, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randn_like(layer.weight) * in_features**-0.5)
        assert layer.bias is not None
        layer.bias.copy_(torch.randn_like(layer.bias) * 0.1)
    return layer.requires_grad_(False)


def section_check() -> None:
    torch.manual_seed(0)
    for rows, hidden, inter in ((16, 1024, 4096), (2048, 1024, 4096), (300, 384, 1536)):
        x = torch.randn(rows, hidden, device=CUDA, dtype=BF16)
        up = linear(hidden, inter)
        assert up.bias is not None
        pre = x.float() @ up.weight.float().t() + up.bias.float()
        fused = linear_gelu(x, up).float()
        for approx in ("none", "tanh"):
            ref = F.gelu(pre, approximate=approx)
            err = (fused - ref).abs()
            unfused = F.gelu(F.linear(x, up.weight, up.bias), approximate=approx).float()  # today's path, rounded twice
            say(f"  check linear_gelu {rows}x{hidden}->{inter} vs fp32 gelu({approx}): max {err.max():.4f} "
                f"mean {err.mean():.2e} | today's unfused path: max {(unfused - ref).abs().max():.4f} "
                f"mean {(unfused - ref).abs().mean():.2e}")
        down = linear(inter, hidden)
        act = torch.randn(rows, inter, device=CUDA, dtype=BF16)
        residual = torch.randn(rows, hidden, device=CUDA, dtype=BF16)
        ref = act.float() @ down.weight.float().t() + residual.float()
        got = linear_into_(act, down, residual.clone()).float()
        say(f"  check linear_into_ {rows}x{inter}->{hidden}: max {(got - ref).abs().max():.4f} "
            f"(values up to {ref.abs().max():.1f})")
        w = torch.rand(hidden, device=CUDA, dtype=BF16) + 0.5
        b = torch.randn(hidden, device=CUDA, dtype=BF16)
        assert down.bias is not None
        ln_ref = F.layer_norm(residual.float() + down.bias.float(), (hidden,), w.float(), b.float(), 1e-12)
        ln = add_layer_norm(residual, down.bias, w, b, 1e-12).float()
        say(f"  check add_layer_norm(bias row) {rows}x{hidden}: max {(ln - ln_ref).abs().max():.4f}")
        assert (ln - ln_ref).abs().max() < 0.1 and (got - ref).abs().max() < 0.25


def layer_row(name: str, hidden: int, inter: int, layers: int, rows: int) -> None:
    """One row of ``layer``: the three variants (and the first and last again) taking turns."""
    torch.manual_seed(1)
    o = [linear(hidden, hidden) for _ in range(layers)]
    up = [linear(hidden, inter) for _ in range(layers)]
    down = [linear(inter, hidden) for _ in range(layers)]
    w = torch.rand(hidden, device=CUDA, dtype=BF16) + 0.5
    b = torch.randn(hidden, device=CUDA, dtype=BF16)
    attn = [torch.randn(rows, hidden, device=CUDA, dtype=BF16) for _ in range(layers)]
    h0 = [torch.randn(rows, hidden, device=CUDA, dtype=BF16) for _ in range(layers)]

    def unfused() -> None:
        for i in range(layers):
            h = add_layer_norm(o[i](attn[i]), h0[i], w, b, 1e-12)
            add_layer_norm(down[i](F.gelu(up[i](h))), h, w, b, 1e-12)

    def gelu_only() -> None:
        for i in range(layers):
            h = add_layer_norm(o[i](attn[i]), h0[i], w, b, 1e-12)
            add_layer_norm(down[i](linear_gelu(h, up[i])), h, w, b, 1e-12)

    def both() -> None:
        # NOTE: h0 grows by one O projection a replay (in place, as in the engine); only the timing matters here
        for i in range(layers):
            assert o[i].bias is not None and down[i].bias is not None
            h = add_layer_norm(linear_into_(attn[i], o[i], h0[i]), o[i].bias, w, b, 1e-12)
            add_layer_norm(linear_into_(linear_gelu(h, up[i]), down[i], h), down[i].bias, w, b, 1e-12)

    cells = {label: graph_us_per_call(fn, layers) for label, fn in
             (("unfused", unfused), ("gelu", gelu_only), ("both", both), ("unfused2", unfused), ("both2", both))}
    off = (cells["unfused"] + cells["unfused2"]) / 2
    on = (cells["both"] + cells["both2"]) / 2
    say(f"  layer {name:<7} rows {rows:>5}: unfused {cells['unfused']:.2f}/{cells['unfused2']:.2f} | "
        f"gelu epilogue {cells['gelu']:.2f} | + residual in GEMMs {cells['both']:.2f}/{cells['both2']:.2f} "
        f"us/layer: {on / off:.3f}x")


def section_layer() -> None:
    for name, hidden, inter, layers in (("bge-m3", 1024, 4096, 24), ("minilm", 384, 1536, 6)):
        for rows in (16384, 2048, 128, 16):
            layer_row(name, hidden, inter, layers, rows)
            gc.collect()
            torch.cuda.empty_cache()


def section_engine(names: tuple[str, ...] = ("bge-m3", "minilm")) -> None:
    for name in names:
        s = shape(name)
        hf = hf_model(s, CUDA, BF16)
        spec, model = native_from_hf(s, hf, CUDA, BF16)
        vocab = spec.config.vocab_size
        longest = min(512, spec.pooling.max_length)
        t1 = random_docs(np.full(1024, longest), vocab, seed=1)
        t2 = random_docs(lognormal_lengths(4096, 150, 0.8, 8, longest, seed=0), vocab, seed=2)
        bidirectional = not spec.config.causal and spec.config.architecture == "qwen3"  # HF Qwen3 needs the 4-D mask
        _, hf_vectors = hf_throughput(hf, s, t2[:512], sort=True, bidirectional=bidirectional)
        del hf
        torch.cuda.empty_cache()
        engines = {on: Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=16384,
                                                 gemm_epilogues=on), model=model) for on in (False, True)}
        assert engines[True].small.gemm_epilogues and not engines[False].small.gemm_epilogues
        for engine in engines.values():  # warm every bucket (eager + capture)
            petal_throughput(engine, t1[:128])
            petal_throughput(engine, t2[:1024])
        rows: dict[bool, dict[str, list[float]]] = {False: {}, True: {}}
        vectors: dict[bool, np.ndarray] = {}
        for _ in range(2):
            for on, engine in engines.items():
                cell = rows[on]
                seconds, _ = petal_throughput(engine, t1)
                cell.setdefault("t1", []).append(sum(map(len, t1)) / seconds)
                seconds, vectors[on] = petal_throughput(engine, t2)
                cell.setdefault("t2", []).append(sum(map(len, t2)) / seconds)
                for n in (16, 128):
                    cell.setdefault(f"l1_{n}", []).append(latency(engine, n, 300, vocab)["p50_ms"])
        for on in (False, True):
            cell = rows[on]
            cos_hf = cosine_rows(vectors[on][:512], hf_vectors)
            say(f"  engine {name:<7} epilogues {'on ' if on else 'off'}: T1 "
                + "/".join(f"{v / 1e3:.0f}k" for v in cell["t1"]) + " T2 "
                + "/".join(f"{v / 1e3:.0f}k" for v in cell["t2"]) + " tok/s | L1 16 "
                + "/".join(f"{v:.3f}" for v in cell["l1_16"]) + " 128 "
                + "/".join(f"{v:.3f}" for v in cell["l1_128"])
                + f" ms | cos vs HF min {cos_hf.min():.6f} mean {cos_hf.mean():.6f}")
        ratio = {k: np.mean(rows[True][k]) / np.mean(rows[False][k]) for k in rows[True]}
        cos = cosine_rows(vectors[True], vectors[False])
        say(f"  engine {name:<7} on/off: " + " ".join(f"{k} {v:.3f}x" for k, v in ratio.items())
            + f" | cos on vs off min {cos.min():.6f}")
        del engines
        gc.collect()
        torch.cuda.synchronize()
        del model
        torch.cuda.empty_cache()


SWIGLU_TILES = [(128, 64, 64, 4, 8), (128, 128, 64, 3, 8), (64, 128, 64, 4, 4), (128, 64, 64, 3, 4),
                (64, 64, 64, 4, 4), (128, 128, 32, 4, 8), (128, 64, 128, 3, 8), (64, 128, 128, 3, 8)]


def swiglu_row(rows: int, hidden: int = 1024, inter: int = 3072, layers: int = 28) -> None:
    from petal.engine.layers.activation import silu_and_mul
    from petal.engine.layers.fused_mlp import gate_up_silu

    torch.manual_seed(3)
    weights = [torch.randn(2 * inter, hidden, device=CUDA, dtype=BF16) * hidden**-0.5 for _ in range(layers)]
    xs = [torch.randn(rows, hidden, device=CUDA, dtype=BF16) for _ in range(layers)]
    ref = silu_and_mul(F.linear(xs[0], weights[0])).float()

    def unfused() -> None:
        for i in range(layers):
            silu_and_mul(F.linear(xs[i], weights[i]))

    def fused_with(tiles: tuple[int, int, int, int, int]) -> Callable[[], None]:
        bm, bn, bk, stages, warps = tiles

        def fused() -> None:
            for i in range(layers):
                gate_up_silu(xs[i], weights[i], block_m=bm, block_n=bn, block_k=bk, num_stages=stages,
                             num_warps=warps)
        return fused

    base = graph_us_per_call(unfused, layers)
    cells = []
    for tiles in SWIGLU_TILES:
        bm, bn, bk, stages, warps = tiles
        try:
            got = gate_up_silu(xs[0], weights[0], block_m=bm, block_n=bn, block_k=bk, num_stages=stages,
                               num_warps=warps).float()
            cells.append((graph_us_per_call(fused_with(tiles), layers), tiles, float((got - ref).abs().max())))
        except Exception as exc:  # a tile set that does not compile or fit in shared memory
            print(f"  swiglu {rows} {tiles}: {type(exc).__name__}", flush=True)
    cells.sort()
    flops = 2 * rows * hidden * 2 * inter
    say(f"  swiglu rows {rows}: cuBLAS + silu_and_mul {base:.1f} us/layer ({flops / base / 1e6:.0f} TFLOP/s) | "
        "best fused " + ", ".join(f"{us:.1f} us {cfg} ({flops / us / 1e6:.0f} TFLOP/s, max err {err:.3f})"
                                  for us, cfg, err in cells[:3]))


def section_swiglu() -> None:
    """Qwen3's gate/up GEMM + SwiGLU at large buckets: cuBLAS + FlashInfer's ``silu_and_mul`` against the
    small-batch path's fused Triton kernel over tile candidates (28 layers' distinct weights and inputs)."""
    for rows in (16384, 4096):
        swiglu_row(rows)
        gc.collect()
        torch.cuda.empty_cache()


SECTIONS: dict[str, Callable[[], None]] = {"check": section_check, "layer": section_layer,
                                           "engine": section_engine, "swiglu": section_swiglu,
                                           "engine_qwen3": lambda: section_engine(("pplx-embed-0.6b",))}


def main() -> None:
    chosen = sys.argv[1:] or ["check", "layer", "engine"]
    torch.backends.cuda.matmul.allow_tf32 = True
    with torch.inference_mode():
        for name in chosen:
            print(f"=== {name}", flush=True)
            SECTIONS[name]()
    print("\n=== summary")
    print("\n".join(SUMMARY))


if __name__ == "__main__":
    main()
