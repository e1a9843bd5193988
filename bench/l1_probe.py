"""The small-batch path (engine/small_batch.py), measured piece by piece on the GPU host.

    python3 bench/l1_probe.py [SECTION ...]      (sections: kernels gemm engine buckets; default all)

- ``engine``: L1 (one sequence of 16 and of 128 tokens, step -> result, warm) of the pplx-embed-0.6b,
  bge-m3 and MiniLM shapes with each small-batch kernel on and off, in one process, and the vectors
  of every variant against the all-off engine (cosine).
- ``kernels``: per-layer device time inside CUDA graphs (28 distinct inputs and weights, so reads
  come from HBM): the fused attention against q/k norm + RoPE + FlashInfer, and the gate/up +
  SwiGLU kernel against cuBLAS + ``silu_and_mul``; each checked against a float32 reference first.
- ``gemm``: a layer's four GEMMs (cuBLAS) at M = 16/64/128 with cold weights (28 layers' worth) and
  L2-warm weights (one layer's over and over): what prefetching weights into L2 could buy at most.
- ``skinny``: the weight-streaming layer kernels (engine/layers/skinny_linear.py) against float32
  references (eager and in graphs, PDL on and off), then per-layer device time of a whole Qwen3 layer
  chain (28 layers) as the small-batch path runs it today vs as skinny kernels, and a tile sweep.
- ``buckets``: step time (graph replay) of larger buckets with the small-batch path on and off,
  which sets the token limits.
"""

# ruff: noqa: B023  (each closure below is timed inside the loop iteration that made it)
from __future__ import annotations

import gc
import sys
import time
import traceback
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from petal.bench.gpu import latency, random_docs
from petal.bench.shapes import hf_model, native_from_hf, shape
from petal.engine.batch import PackedBatch, token_bucket
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine
from petal.engine.graphs import seq_capacity
from petal.engine.inputs import InputLayout, fill_inputs

CUDA = torch.device("cuda")
BF16 = torch.bfloat16
LAYERS = 28
SUMMARY: list[str] = []


def graph_us_per_call(fn: Callable[[], None], calls_in_graph: int, reps: int = 30) -> float:
    """Device microseconds per call of ``fn`` captured ``calls_in_graph`` times... (``fn`` runs them all)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps / calls_in_graph)
    return float(np.median(times))


def variants() -> dict[str, EngineConfig]:
    def config(attention: int, mlp: int, skinny: int = 0, pdl: bool = True) -> EngineConfig:
        return EngineConfig(device="cuda", dtype="bfloat16", token_budget=16384, small_attention_tokens=attention,
                            fused_mlp_tokens=mlp, skinny_layer_tokens=skinny, pdl=pdl)

    return {"off": config(0, 0), "attention": config(128, 0), "mlp": config(0, 32),
            "att+mlp": config(128, 32), "skinny-nopdl": config(128, 32, 16, pdl=False), "skinny32": config(128, 32, 32),
            "default": EngineConfig(device="cuda", dtype="bfloat16", token_budget=16384)}


def release(engine: Engine) -> None:
    """Drop an engine and its graphs now: a CUDA graph freed by the garbage collector while another
    engine captures would invalidate that capture."""
    del engine
    gc.collect()
    torch.cuda.synchronize()


def section_engine(shapes: tuple[str, ...] = ("pplx-embed-0.6b", "bge-m3", "minilm")) -> None:
    for name in shapes:
        s = shape(name)
        hf = hf_model(s, CUDA, BF16)
        spec, model = native_from_hf(s, hf, CUDA, BF16)
        del hf
        torch.cuda.empty_cache()
        vocab = spec.config.vocab_size
        check = PackedBatch.from_sequences(random_docs(np.array([16, 40, 7, 100]), vocab, seed=11))
        reference = None
        rows = []
        for label, config in variants().items():
            engine = Engine(spec, config, model=model)
            l16 = latency(engine, 16, 400, vocab)
            l128 = latency(engine, 128, 400, vocab)
            out = None
            for _ in range(3):  # eager, capture, replay
                out = engine.step(check).result()
            assert out is not None
            if reference is None:
                reference = out
            cos = float(((out * reference).sum(1) / np.linalg.norm(out, axis=1)
                         / np.linalg.norm(reference, axis=1)).min())
            rows.append((label, l16["p50_ms"], l16["p99_ms"], l128["p50_ms"], l128["p99_ms"], cos))
            release(engine)
        print(f"\n{name}: L1 step->result (400 calls) | min cosine to 'off' on a 4-text batch")
        for label, a, b, c, d, cos in rows:
            line = f"  {name:<16} {label:<10} 16 tok p50 {a:.3f} p99 {b:.3f} ms | 128 tok p50 {c:.3f} p99 {d:.3f} ms" \
                   f" | cos {cos:.5f}"
            print(line)
            SUMMARY.append(line)
        del model
        torch.cuda.empty_cache()


def padded_inputs(lengths: list[int], vocab: int = 30000) -> tuple[PackedBatch, InputLayout, torch.Tensor]:
    batch = PackedBatch.from_sequences(random_docs(np.array(lengths), vocab, seed=len(lengths)))
    bucket = token_bucket(batch.num_tokens)
    layout = InputLayout(bucket, seq_capacity(bucket, 256))
    host = np.zeros(layout.size, dtype=np.int32)
    fill_inputs(host, layout, batch)
    return batch, layout, torch.from_numpy(host).to(CUDA)


def section_kernels() -> None:
    import flashinfer

    from petal.engine.layers.activation import silu_and_mul
    from petal.engine.layers.fused_mlp import gate_up_silu
    from petal.engine.layers.rotary import RotaryEmbedding
    from petal.engine.layers.small_attention import small_attention
    from petal.engine.layers.triton_kernels import qk_norm_rope_

    hq, hk, d = 16, 8, 128
    width = (hq + 2 * hk) * d
    table = RotaryEmbedding(d, 4096, 1e6).cos_sin(CUDA)
    weights = (torch.rand(2, d, device=CUDA) + 0.5).to(BF16)
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=CUDA)
    print("\nattention per layer (device us, graph of 28 layers): fused Triton vs qk_norm_rope + FlashInfer")
    for lengths in ([16], [128], [30] * 8, [200], [64] * 8, [500]):
        batch, layout, buf = padded_inputs(lengths)
        sl = layout.slices()
        seq_ids, cu = buf[sl["token_seq_ids"]], buf[sl["cu_seqlens"]]
        positions = buf[sl["positions"]]
        cu_cpu = torch.from_numpy(np.ascontiguousarray(buf[sl["cu_seqlens"]].cpu().numpy())).pin_memory()
        t = layout.num_tokens
        qkvs = [torch.randn(t, width, device=CUDA, dtype=BF16) for _ in range(LAYERS)]
        # correctness of the fused kernel against the unfused path
        ref_qkv = qkvs[0].clone()
        qk_norm_rope_(ref_qkv, positions, table, weights, 1e-6, hq, hk, d)
        q, k, v = ref_qkv.split([hq * d, hk * d, hk * d], -1)
        wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=torch.zeros_like(cu),
            kv_indptr_buf=torch.zeros_like(cu))
        wrapper.plan(cu_cpu, cu_cpu, hq, hk, d, causal=False, sm_scale=d**-0.5, q_data_type=BF16, kv_data_type=BF16)
        ref = wrapper.run(q.reshape(t, hq, d), k.reshape(t, hk, d), v.reshape(t, hk, d))
        real = batch.num_tokens
        for block_m in (16, 32, 64):
            out = small_attention(qkvs[0], seq_ids, cu, num_heads=hq, num_kv_heads=hk, head_dim=d, causal=False,
                                  scale=d**-0.5, positions=positions, rope_table=table, qk_norm_weights=weights,
                                  eps=1e-6, block_m=block_m)
            err = float((out[:real].float() - ref[:real].float()).norm() / ref[:real].float().norm())
            assert err < 2e-2, (lengths, block_m, err)
        outs = [torch.empty(t, hq, d, device=CUDA, dtype=BF16)]
        copies = [q.clone() for q in qkvs]

        def unfused() -> None:
            for x in copies:
                qk_norm_rope_(x, positions, table, weights, 1e-6, hq, hk, d)
                qq, kk, vv = x.split([hq * d, hk * d, hk * d], -1)
                outs[0] = wrapper.run(qq.view(t, hq, d), kk.view(t, hk, d), vv.view(t, hk, d))

        base = graph_us_per_call(unfused, LAYERS)
        cells = [f"flashinfer+rope {base:6.2f}"]
        for block_m in (16, 32, 64):
            def fused(block_m: int = block_m) -> None:
                for x in qkvs:
                    small_attention(x, seq_ids, cu, num_heads=hq, num_kv_heads=hk, head_dim=d, causal=False,
                                    scale=d**-0.5, positions=positions, rope_table=table, qk_norm_weights=weights,
                                    eps=1e-6, block_m=block_m)

            cells.append(f"fused bm{block_m} {graph_us_per_call(fused, LAYERS):6.2f}")
        line = f"  attention bucket {t:4d} ({len(lengths)}x{lengths[0]}): " + " | ".join(cells)
        print(line)
        SUMMARY.append(line)

    print("\ngate/up + SwiGLU per layer (device us, 28 distinct weights): Triton fused vs cuBLAS + silu_and_mul")
    hidden, inter = 1024, 3072
    ws = [torch.randn(2 * inter, hidden, device=CUDA, dtype=BF16) * 0.03 for _ in range(LAYERS)]
    for m in (16, 64, 128, 256):
        x = torch.randn(m, hidden, device=CUDA, dtype=BF16)
        ref = silu_and_mul(F.linear(x, ws[0]))
        best = None
        cells = []

        def unfused_mlp() -> None:
            for w in ws:
                silu_and_mul(F.linear(x, w))

        cells.append(f"cublas+silu {graph_us_per_call(unfused_mlp, LAYERS):6.2f}")
        for block_m, block_n, block_k, stages, warps in [
                (16, 32, 128, 4, 4), (16, 16, 256, 3, 4), (16, 32, 256, 3, 4), (16, 16, 128, 6, 4), (16, 64, 128, 4, 4),
                (16, 16, 64, 8, 2), (16, 32, 64, 6, 4), (32, 32, 128, 4, 4), (64, 32, 128, 3, 4), (64, 64, 64, 4, 4),
                (16, 16, 128, 5, 2), (128, 32, 64, 3, 4), (128, 64, 64, 3, 8)]:
            if block_m > max(16, m) * 2:
                continue
            try:
                got = gate_up_silu(x, ws[0], block_m=block_m, block_n=block_n, block_k=block_k, num_stages=stages,
                                   num_warps=warps)
                err = float((got.float() - ref.float()).norm() / ref.float().norm())
                assert err < 2e-2, err

                def fused_mlp(cfg: tuple[int, int, int, int, int] = (block_m, block_n, block_k, stages, warps)) -> None:
                    for w in ws:
                        gate_up_silu(x, w, block_m=cfg[0], block_n=cfg[1], block_k=cfg[2], num_stages=cfg[3],
                                     num_warps=cfg[4])

                us = graph_us_per_call(fused_mlp, LAYERS)
                cells.append(f"{block_m}/{block_n}/{block_k}/s{stages}/w{warps} {us:6.2f}")
                best = us if best is None else min(best, us)
            except Exception as exc:  # a config that does not fit: say so, keep going
                cells.append(f"{block_m}/{block_n}/{block_k}: {type(exc).__name__}")
        line = f"  gate_up M={m:4d}: " + " | ".join(cells)
        print(line)
        SUMMARY.append(line)


def section_gemm() -> None:
    shapes = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]  # (N, K) of pplx's qkv, o, gate_up, down
    layers = [[torch.randn(n, k, device=CUDA, dtype=BF16) * 0.03 for n, k in shapes] for _ in range(LAYERS)]
    print("\nGEMMs of one layer (device us per layer, cuBLAS): cold weights, L2-warm (one layer's, repeated)")
    for m in (16, 64, 128):
        xs = {k: torch.randn(m, k, device=CUDA, dtype=BF16) for _, k in shapes}

        def chain(weights: list[list[torch.Tensor]]) -> Callable[[], None]:
            def run() -> None:
                for wqkv, wo, wgu, wd in weights:
                    F.linear(xs[1024], wqkv)
                    F.linear(xs[2048], wo)
                    F.linear(xs[1024], wgu)
                    F.linear(xs[3072], wd)
            return run

        cold = graph_us_per_call(chain(layers), LAYERS)
        warm = graph_us_per_call(chain([layers[0]] * LAYERS), LAYERS)
        line = f"  gemm M={m:4d}: cold {cold:6.2f} | L2-warm {warm:6.2f} us/layer"
        print(line)
        SUMMARY.append(line)


def section_skinny() -> None:
    import flashinfer

    from petal.engine.layers.fused_mlp import gate_up_silu
    from petal.engine.layers.skinny_linear import (
        DEFAULT_TILES,
        NormInput,
        SkinnyTiles,
        linear_add,
        norm_input,
        norm_linear,
    )
    from petal.engine.layers.small_attention import small_attention

    hidden, hq, hk, d, inter, eps = 1024, 16, 8, 128, 3072, 1e-6  # pplx-embed-0.6b
    q_size, width = hq * d, (hq + 2 * hk) * d

    def rms(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * g.float()

    print("\nskinny kernels against float32 references (max |err| / max |ref|), eager | graph, pdl off/on")
    for m in (1, 7, 16, 17, 32):
        x = torch.randn(m, hidden, device=CUDA, dtype=BF16)
        g = (torch.rand(hidden, device=CUDA) + 0.5).to(BF16)
        wqkv = torch.randn(width, hidden, device=CUDA, dtype=BF16) * 0.03
        wgu = torch.randn(2 * inter, hidden, device=CUDA, dtype=BF16) * 0.03
        wd = torch.randn(hidden, inter, device=CUDA, dtype=BF16) * 0.03
        act = torch.randn(m, inter, device=CUDA, dtype=BF16)
        ref_qkv = rms(x, g) @ wqkv.float().T
        gu = rms(x, g) @ wgu.float().T
        ref_act = F.silu(gu[:, :inter]) * gu[:, inter:]
        ref_add = x.float() + act.float() @ wd.float().T
        cells = []
        for pdl in (False, True):
            outs: dict[str, torch.Tensor] = {}

            def run() -> None:
                first = norm_input(x, g)
                outs["qkv"] = norm_linear(first, eps, wqkv, pdl=pdl)
                outs["act"] = norm_linear(first, eps, wgu, swiglu=True, pdl=pdl)
                outs["add"] = linear_add(act, wd, x, pdl=pdl)[0]

            run()
            eager = {k: v.clone() for k, v in outs.items()}
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
            for key, ref in (("qkv", ref_qkv), ("act", ref_act), ("add", ref_add)):
                err = float((eager[key].float() - ref).abs().max() / ref.abs().max())
                same = torch.equal(eager[key], outs[key])
                cells.append(f"{key}{'+pdl' if pdl else ''} {err:.4f}{'' if same else ' GRAPH DIFFERS'}")
                assert err < 0.02 and same, (m, key, pdl, err, same)
        line = f"  M={m:3d}: " + " | ".join(cells)
        print(line)
        SUMMARY.append(line)

    layers = [{"g1": (torch.rand(hidden, device=CUDA) + 0.5).to(BF16),
               "g2": (torch.rand(hidden, device=CUDA) + 0.5).to(BF16),
               "qkv": torch.randn(width, hidden, device=CUDA, dtype=BF16) * 0.03,
               "o": torch.randn(hidden, q_size, device=CUDA, dtype=BF16) * 0.03,
               "gu": torch.randn(2 * inter, hidden, device=CUDA, dtype=BF16) * 0.03,
               "down": torch.randn(hidden, inter, device=CUDA, dtype=BF16) * 0.03} for _ in range(LAYERS)]
    qk_w = (torch.rand(2, d, device=CUDA) + 0.5).to(BF16)
    from petal.engine.layers.rotary import RotaryEmbedding
    table = RotaryEmbedding(d, 1024, 1e6).cos_sin(CUDA)
    print("\nQwen3 layer chain, 28 layers (device us per layer)")
    for m in (16, 32):
        x0 = torch.randn(m, hidden, device=CUDA, dtype=BF16)
        seq_ids = torch.zeros(m, dtype=torch.int32, device=CUDA)
        cu = torch.tensor([0, m], dtype=torch.int32, device=CUDA)
        pos = torch.arange(m, dtype=torch.int32, device=CUDA)
        h = x0.clone()
        res = x0.clone()

        def attend(qkv: torch.Tensor, pdl: bool = False) -> torch.Tensor:
            return small_attention(qkv, seq_ids, cu, num_heads=hq, num_kv_heads=hk, head_dim=d, causal=False,
                                   scale=d**-0.5, positions=pos, rope_table=table, qk_norm_weights=qk_w, eps=eps,
                                   pdl=pdl).view(m, q_size)

        def today() -> None:
            h.copy_(x0)
            res.copy_(x0)
            hh = h
            for w in layers:
                flashinfer.fused_add_rmsnorm(hh, res, w["g1"], eps)
                hh = F.linear(attend(F.linear(hh, w["qkv"])), w["o"])
                flashinfer.fused_add_rmsnorm(hh, res, w["g2"], eps)
                hh = F.linear(gate_up_silu(hh, w["gu"]), w["down"])

        def skinny(pdl: bool, tiles: SkinnyTiles = DEFAULT_TILES) -> Callable[[], None]:
            def run() -> None:
                res.copy_(x0)
                x: NormInput | None = norm_input(res, layers[0]["g1"])
                for i, w in enumerate(layers):
                    assert x is not None
                    a = attend(norm_linear(x, eps, w["qkv"], pdl=pdl, tiles=tiles), pdl)
                    _, mid = linear_add(a, w["o"], res, out=res, norm_weight=w["g2"], pdl=pdl, tiles=tiles)
                    assert mid is not None
                    act = norm_linear(mid, eps, w["gu"], swiglu=True, pdl=pdl, tiles=tiles)
                    nxt = layers[i + 1]["g1"] if i + 1 < len(layers) else None
                    x = linear_add(act, w["down"], res, out=res, norm_weight=nxt, pdl=pdl, tiles=tiles)[1]
            return run

        cells = [f"today {graph_us_per_call(today, LAYERS):.2f}",
                 f"skinny {graph_us_per_call(skinny(False), LAYERS):.2f}",
                 f"skinny+pdl {graph_us_per_call(skinny(True), LAYERS):.2f}"]
        line = f"  M={m:3d}: " + " | ".join(cells)
        print(line, flush=True)
        SUMMARY.append(line)
        sweep = [SkinnyTiles(block_n=bn, add_block_n=abn, split_k=sk, num_stages=st, num_warps=nw)
                 for bn in (32, 64) for abn, sk in ((32, 4), (32, 8), (64, 8))
                 for st, nw in ((3, 4), (4, 4))]
        timed = []
        for tiles in sweep:
            try:
                timed.append((graph_us_per_call(skinny(True, tiles), LAYERS), tiles))
            except Exception as exc:  # a tile set that does not compile or fit
                print(f"    {tiles}: {type(exc).__name__}")
        timed.sort(key=lambda t: t[0])
        for us, tiles in timed[:6]:
            line = f"    M={m:3d} pdl {us:6.2f} us/layer  {tiles}"
            print(line)
            SUMMARY.append(line)
        print(f"    M={m:3d} worst {timed[-1][0]:.2f} {timed[-1][1]}", flush=True)


def section_skinny_parts() -> None:
    """Each skinny kernel alone, 28 distinct weights in a graph, against what today's path runs there."""
    import flashinfer

    from petal.engine.layers.fused_mlp import gate_up_silu
    from petal.engine.layers.skinny_linear import SkinnyTiles, linear_add, norm_linear

    hidden, width, q_size, inter, eps = 1024, 4096, 2048, 3072, 1e-6
    g = (torch.rand(hidden, device=CUDA) + 0.5).to(BF16)
    w = {name: [torch.randn(n, k, device=CUDA, dtype=BF16) * 0.03 for _ in range(LAYERS)]
         for name, (n, k) in {"qkv": (width, hidden), "o": (hidden, q_size), "gu": (2 * inter, hidden),
                              "down": (hidden, inter)}.items()}
    print("\nskinny kernels one by one (device us per call, 28 distinct weights in one graph)")
    for m in (16, 32):
        x = torch.randn(m, hidden, device=CUDA, dtype=BF16)
        a_o = torch.randn(m, q_size, device=CUDA, dtype=BF16)
        a_d = torch.randn(m, inter, device=CUDA, dtype=BF16)
        res = torch.randn(m, hidden, device=CUDA, dtype=BF16)
        def each(fn: Callable[[torch.Tensor], object], weights: list[torch.Tensor]) -> Callable[[], None]:
            def run() -> None:
                for wi in weights:
                    fn(wi)
            return run

        rows: dict[str, Callable[[], None]] = {
            "cublas qkv": each(lambda wi: F.linear(x, wi), w["qkv"]),
            "cublas gu": each(lambda wi: F.linear(x, wi), w["gu"]),
            "triton gate_up_silu": each(lambda wi: gate_up_silu(x, wi), w["gu"]),
            "cublas o": each(lambda wi: F.linear(a_o, wi), w["o"]),
            "cublas down": each(lambda wi: F.linear(a_d, wi), w["down"]),
            "fused_add_rmsnorm": each(lambda wi: flashinfer.fused_add_rmsnorm(x, res, g, eps), w["o"]),
        }
        parts = linear_add(a_o, w["o"][0], res.clone(), norm_weight=g)[1]
        assert parts is not None
        def norm_run(tiles: SkinnyTiles, pdl: bool, swiglu: bool) -> Callable[[torch.Tensor], object]:
            return lambda wi: norm_linear(parts, eps, wi, swiglu=swiglu, pdl=pdl, tiles=tiles)

        def add_run(a: torch.Tensor, tiles: SkinnyTiles, pdl: bool,
                    norm: torch.Tensor | None = None) -> Callable[[torch.Tensor], object]:
            return lambda wi: linear_add(a, wi, res, out=res, norm_weight=norm, pdl=pdl, tiles=tiles)

        for pdl in (False, True):
            tag = "+pdl" if pdl else ""
            for bn, st, nw in ((32, 4, 4), (32, 3, 4), (64, 4, 4), (64, 3, 4), (16, 4, 4)):
                t = SkinnyTiles(block_n=bn, num_stages=st, num_warps=nw)
                name = f"{tag} bn{bn} st{st} w{nw}"
                rows[f"norm_linear qkv{name}"] = each(norm_run(t, pdl, False), w["qkv"])
                rows[f"norm_linear gu swiglu{name}"] = each(norm_run(t, pdl, True), w["gu"])
            for abn, sk in ((32, 4), (32, 8), (16, 8)):
                t = SkinnyTiles(add_block_n=abn, split_k=sk)
                rows[f"linear_add o{tag} bn{abn} split{sk}"] = each(add_run(a_o, t, pdl), w["o"])
                rows[f"linear_add o +scaled{tag} bn{abn} split{sk}"] = each(add_run(a_o, t, pdl, g), w["o"])
                rows[f"linear_add down{tag} bn{abn} split{sk}"] = each(add_run(a_d, t, pdl), w["down"])
        for label, fn in rows.items():
            try:
                line = f"  M={m:3d} {label:<40} {graph_us_per_call(fn, LAYERS):7.2f}"
            except Exception as exc:
                line = f"  M={m:3d} {label:<40} {type(exc).__name__}: {str(exc)[:80]}"
            print(line, flush=True)
            SUMMARY.append(line)


def section_buckets(name: str = "pplx-embed-0.6b") -> None:
    s = shape(name)
    hf = hf_model(s, CUDA, BF16)
    spec, model = native_from_hf(s, hf, CUDA, BF16)
    del hf
    vocab = spec.config.vocab_size
    print(f"\n{name}: step time by bucket (serial step->result, ms), small-batch path off vs each piece")
    configs = variants()
    engines = {label: Engine(spec, configs[label], model=model) for label in ("off", "attention", "mlp", "default")}
    for lengths in ([10], [30], [60], [100], [64] * 3, [32] * 8, [128] * 4, [128] * 8):
        batch = PackedBatch.from_sequences(random_docs(np.array(lengths), vocab, seed=3))
        cells = []
        for label, engine in engines.items():
            for _ in range(4):
                engine.step(batch).result()
            started = time.perf_counter()
            for _ in range(100):
                engine.step(batch).result()
            cells.append(f"{label} {(time.perf_counter() - started) * 10:.3f}")
        line = f"  bucket {token_bucket(batch.num_tokens):5d} ({len(lengths)}x{lengths[0]}): " + " | ".join(cells)
        print(line)
        SUMMARY.append(line)


def main() -> None:
    sections = sys.argv[1:] or ["kernels", "gemm", "skinny", "engine", "buckets"]
    torch.manual_seed(0)
    for name in sections:
        started = time.perf_counter()
        try:
            {"engine": section_engine, "kernels": section_kernels, "gemm": section_gemm,
             "buckets": section_buckets, "skinny": section_skinny, "skinny_parts": section_skinny_parts,
             "engine_pplx": lambda: section_engine(("pplx-embed-0.6b",))}[name]()
        except Exception:
            traceback.print_exc()
            SUMMARY.append(f"  {name}: FAILED (traceback above)")
        print(f"[{name}: {time.perf_counter() - started:.1f} s]", flush=True)
    print("\n=== summary")
    print("\n".join(SUMMARY))


if __name__ == "__main__":
    main()
