"""The small-batch path (engine/small_batch.py), measured piece by piece on the GPU host.

    python3 bench/l1_probe.py [SECTION ...]      (default: kernels gemm skinny engine buckets)

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
  chain (28 layers) as the small-batch path runs it today vs as skinny kernels, at 16 and 32 rows.
- ``skinny_sweep``: per bucket of 32/64/128 rows, each skinny kernel over its tile candidates, then the
  chain with the best of each; the best go into ``BUCKET_TILES`` for later sections of the same run.
- ``engine_pplx`` / ``engine_buckets``: ``engine`` for the pplx-embed-0.6b shape only / with every skinny
  limit (16-128 tokens) at 16, 30, 60 and 128-token queries.
- ``gaps``: a 128-token step after the host idled 0.3-3 ms (sleeping or spinning), alone and behind the
  server's two thread hand-offs: what a lone server request pays that back-to-back L1 does not.
- ``buckets``: step time (graph replay) of larger buckets with the small-batch path on and off,
  which sets the token limits.
"""

# ruff: noqa: B023  (each closure below is timed inside the loop iteration that made it)
from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from petal.bench.gpu import graph_us_per_call, latency, random_docs, replay_in_graph, run_sections
from petal.bench.shapes import hf_model, native_from_hf, shape
from petal.engine.batch import PackedBatch, token_bucket
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine
from petal.engine.graphs import seq_capacity
from petal.engine.inputs import InputLayout, fill_inputs
from petal.engine.loader import ModelSpec

CUDA = torch.device("cuda")
BF16 = torch.bfloat16
LAYERS = 28
SUMMARY: list[str] = []


def variants() -> dict[str, EngineConfig]:
    def config(attention: int, mlp: int, skinny: int = 0, pdl: bool = True) -> EngineConfig:
        return EngineConfig(device="cuda", dtype="bfloat16", token_budget=16384, small_attention_tokens=attention,
                            fused_mlp_tokens=mlp, skinny_layer_tokens=skinny, pdl=pdl)

    return {"off": config(0, 0), "attention": config(128, 0), "mlp": config(0, 32),
            "att+mlp": config(128, 32), "skinny-nopdl": config(128, 32, 16, pdl=False), "skinny32": config(128, 32, 32),
            "skinny64": config(128, 32, 64), "skinny128": config(128, 32, 128),
            "default": EngineConfig(device="cuda", dtype="bfloat16", token_budget=16384),
            # the same again, for an A/B/A/B order in one process
            "skinny128-2": config(128, 32, 128), "default2": EngineConfig(device="cuda", dtype="bfloat16",
                                                                          token_budget=16384)}


def release(engine: Engine) -> None:
    """Drop an engine and its graphs now: a CUDA graph freed by the garbage collector while another
    engine captures would invalidate that capture."""
    del engine
    gc.collect()
    torch.cuda.synchronize()


def native_model(name: str) -> tuple[ModelSpec, torch.nn.Module]:
    """The native model of shape ``name`` on the GPU (random weights, made through Hugging Face's)."""
    s = shape(name)
    hf = hf_model(s, CUDA, BF16)
    spec, model = native_from_hf(s, hf, CUDA, BF16)
    del hf
    torch.cuda.empty_cache()
    return spec, model


def engines_taking_turns(setups: dict[str, Callable[[], None]], lengths: tuple[int, ...], rounds: int,
                         name: str = "pplx-embed-0.6b") -> dict[str, list[float]]:
    """One engine per setup over one model (``setup()`` runs before its engine is built and its buckets
    captured: it sets what the graphs read at capture), then L1 p50 ms at each length, the engines taking
    turns for ``rounds`` rounds; prints and keeps the min cosine between the first two engines' vectors."""
    spec, model = native_model(name)
    vocab = spec.config.vocab_size
    engines = {}
    for label, setup in setups.items():
        setup()
        engine = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=16384), model=model)
        for n in lengths:
            latency(engine, n, 5, vocab)  # capture the bucket now
        engines[label] = engine
    rows: dict[str, list[float]] = {}
    for _ in range(rounds):
        for label, engine in engines.items():
            rows.setdefault(label, []).extend(latency(engine, n, 400, vocab)["p50_ms"] for n in lengths)
    check = PackedBatch.from_sequences(random_docs(np.array([16, 40, 7, 50]), vocab, seed=11))
    outs = [engine.step(check).result() for engine in list(engines.values())[:2]]
    cos = float(((outs[0] * outs[-1]).sum(1) / np.linalg.norm(outs[0], axis=1)
                 / np.linalg.norm(outs[-1], axis=1)).min())
    for label, cells in rows.items():
        line = f"  engine L1 {label:<8} {' / '.join(map(str, lengths))} tokens p50 ms, {rounds} rounds: " + \
            " ".join(f"{c:.3f}" for c in cells)
        print(line)
        SUMMARY.append(line)
    line = f"  min cosine of the first two engines' vectors on a 113-token batch: {cos:.6f}"
    print(line)
    SUMMARY.append(line)
    return rows


def section_engine(shapes: tuple[str, ...] = ("pplx-embed-0.6b", "bge-m3", "minilm"),
                   labels: tuple[str, ...] | None = None, lengths: tuple[int, ...] = (16, 128)) -> None:
    """L1 (step -> result, 400 calls) at each query length for each variant, and the min cosine of each
    variant's vectors to the first variant's on batches of the 192, 128 and 64-token buckets."""
    for name in shapes:
        spec, model = native_model(name)
        vocab = spec.config.vocab_size
        checks = [PackedBatch.from_sequences(random_docs(np.array(lens), vocab, seed=11))
                  for lens in ([16, 40, 7, 100], [16, 40, 7, 50], [5, 40, 7])]
        references: list[np.ndarray] = []
        rows = []
        for label, config in variants().items():
            if labels is not None and label not in labels:
                continue
            engine = Engine(spec, config, model=model)
            cells = [latency(engine, n, 400, vocab) for n in lengths]
            cos = 1.0
            for i, check in enumerate(checks):
                out = None
                for _ in range(3):  # eager, capture, replay
                    out = engine.step(check).result()
                assert out is not None
                if len(references) <= i:
                    references.append(out)
                ref = references[i]
                cos = min(cos, float(((out * ref).sum(1) / np.linalg.norm(out, axis=1)
                                      / np.linalg.norm(ref, axis=1)).min()))
            rows.append((label, cells, cos))
            release(engine)
        print(f"\n{name}: L1 step->result (400 calls) | min cosine to the first variant on 3 batches")
        for label, cells, cos in rows:
            line = f"  {name:<16} {label:<12} " + " | ".join(
                f"{n} tok p50 {c['p50_ms']:.3f} p99 {c['p99_ms']:.3f}" for n, c in zip(lengths, cells)) \
                + f" ms | cos {cos:.5f}"
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


HIDDEN, HQ, HK, HEAD_DIM, INTER, EPS = 1024, 16, 8, 128, 3072, 1e-6  # pplx-embed-0.6b
Q_SIZE, QKV_WIDTH = HQ * HEAD_DIM, (HQ + 2 * HK) * HEAD_DIM
ChainFor = Callable[[int], tuple[Callable[[], None], Callable[..., Callable[[], None]]]]


def layer_chains() -> ChainFor:
    """``chain_for(m)`` -> ``(today, skinny)``: 28 Qwen3 layers (distinct random weights) at ``m`` rows as
    the small-batch path runs them today for that bucket, and ``skinny(pdl, tiles=None)`` as skinny kernels."""
    import flashinfer

    from petal.engine.layers.fused_mlp import gate_up_silu
    from petal.engine.layers.rotary import RotaryEmbedding
    from petal.engine.layers.skinny_linear import (
        LayerTiles,
        NormInput,
        layer_tiles,
        linear_add,
        norm_input,
        norm_linear,
    )
    from petal.engine.layers.small_attention import small_attention

    d = HEAD_DIM
    layers = [{"g1": (torch.rand(HIDDEN, device=CUDA) + 0.5).to(BF16),
               "g2": (torch.rand(HIDDEN, device=CUDA) + 0.5).to(BF16),
               "qkv": torch.randn(QKV_WIDTH, HIDDEN, device=CUDA, dtype=BF16) * 0.03,
               "o": torch.randn(HIDDEN, Q_SIZE, device=CUDA, dtype=BF16) * 0.03,
               "gu": torch.randn(2 * INTER, HIDDEN, device=CUDA, dtype=BF16) * 0.03,
               "down": torch.randn(HIDDEN, INTER, device=CUDA, dtype=BF16) * 0.03} for _ in range(LAYERS)]
    qk_w = (torch.rand(2, d, device=CUDA) + 0.5).to(BF16)
    table = RotaryEmbedding(d, 1024, 1e6).cos_sin(CUDA)

    def chain_for(m: int) -> tuple[Callable[[], None], Callable[..., Callable[[], None]]]:
        x0 = torch.randn(m, HIDDEN, device=CUDA, dtype=BF16)
        seq_ids = torch.zeros(m, dtype=torch.int32, device=CUDA)
        cu = torch.tensor([0, m], dtype=torch.int32, device=CUDA)
        pos = torch.arange(m, dtype=torch.int32, device=CUDA)
        h = x0.clone()
        res = x0.clone()

        def attend(qkv: torch.Tensor, pdl: bool = False) -> torch.Tensor:
            return small_attention(qkv, seq_ids, cu, num_heads=HQ, num_kv_heads=HK, head_dim=d, causal=False,
                                   scale=d**-0.5, positions=pos, rope_table=table, qk_norm_weights=qk_w, eps=EPS,
                                   pdl=pdl).view(m, Q_SIZE)

        def today() -> None:  # the engine's path for buckets above the skinny limit (fused MLP up to 32 rows)
            h.copy_(x0)
            res.copy_(x0)
            hh = h
            for w in layers:
                flashinfer.fused_add_rmsnorm(hh, res, w["g1"], EPS)
                hh = F.linear(attend(F.linear(hh, w["qkv"])), w["o"])
                flashinfer.fused_add_rmsnorm(hh, res, w["g2"], EPS)
                act = gate_up_silu(hh, w["gu"]) if m <= 32 else flashinfer.silu_and_mul(F.linear(hh, w["gu"]))
                hh = F.linear(act, w["down"])

        def skinny(pdl: bool, tiles: LayerTiles | None = None) -> Callable[[], None]:
            t = tiles or layer_tiles(m)

            def run() -> None:
                res.copy_(x0)
                x: NormInput | None = norm_input(res, layers[0]["g1"])
                for i, w in enumerate(layers):
                    assert x is not None
                    a = attend(norm_linear(x, EPS, w["qkv"], pdl=pdl, tiles=t.qkv), pdl)
                    _, mid = linear_add(a, w["o"], res, out=res, norm_weight=w["g2"], pdl=pdl, tiles=t.o)
                    assert mid is not None
                    act = norm_linear(mid, EPS, w["gu"], swiglu=True, pdl=pdl, tiles=t.gate_up)
                    nxt = layers[i + 1]["g1"] if i + 1 < len(layers) else None
                    x = linear_add(act, w["down"], res, out=res, norm_weight=nxt, pdl=pdl, tiles=t.down)[1]
            return run

        return today, skinny

    return chain_for


def check_skinny(rows: tuple[int, ...]) -> None:
    """The skinny kernels at each row count (the bucket's tiles) against float32, eager == graph replay."""
    from petal.engine.layers.skinny_linear import linear_add, norm_input, norm_linear

    def rms(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS) * g.float()

    print("\nskinny kernels against float32 references (max |err| / max |ref|), eager | graph, pdl off/on")
    for m in rows:
        x = torch.randn(m, HIDDEN, device=CUDA, dtype=BF16)
        g = (torch.rand(HIDDEN, device=CUDA) + 0.5).to(BF16)
        wqkv = torch.randn(QKV_WIDTH, HIDDEN, device=CUDA, dtype=BF16) * 0.03
        wgu = torch.randn(2 * INTER, HIDDEN, device=CUDA, dtype=BF16) * 0.03
        wd = torch.randn(HIDDEN, INTER, device=CUDA, dtype=BF16) * 0.03
        act = torch.randn(m, INTER, device=CUDA, dtype=BF16)
        ref_qkv = rms(x, g) @ wqkv.float().T
        gu = rms(x, g) @ wgu.float().T
        ref_act = F.silu(gu[:, :INTER]) * gu[:, INTER:]
        ref_add = x.float() + act.float() @ wd.float().T
        cells = []
        for pdl in (False, True):
            outs: dict[str, torch.Tensor] = {}

            def run() -> None:
                first = norm_input(x, g)
                outs["qkv"] = norm_linear(first, EPS, wqkv, pdl=pdl)
                outs["act"] = norm_linear(first, EPS, wgu, swiglu=True, pdl=pdl)
                outs["add"] = linear_add(act, wd, x, pdl=pdl)[0]

            run()
            eager = {k: v.clone() for k, v in outs.items()}
            replay_in_graph(run)
            for key, ref in (("qkv", ref_qkv), ("act", ref_act), ("add", ref_add)):
                err = float((eager[key].float() - ref).abs().max() / ref.abs().max())
                same = torch.equal(eager[key], outs[key])
                cells.append(f"{key}{'+pdl' if pdl else ''} {err:.4f}{'' if same else ' GRAPH DIFFERS'}")
                assert err < 0.02 and same, (m, key, pdl, err, same)
        line = f"  M={m:3d}: " + " | ".join(cells)
        print(line)
        SUMMARY.append(line)


def section_skinny() -> None:
    """The skinny kernels' accuracy, then the 28-layer chain today vs skinny (PDL off/on) at 16 and 32 rows."""
    check_skinny((1, 7, 16, 17, 32))
    chain_for = layer_chains()
    print("\nQwen3 layer chain, 28 layers (device us per layer)")
    for m in (16, 32):
        today, skinny = chain_for(m)
        cells = [f"today {graph_us_per_call(today, LAYERS):.2f}",
                 f"skinny {graph_us_per_call(skinny(False), LAYERS):.2f}",
                 f"skinny+pdl {graph_us_per_call(skinny(True), LAYERS):.2f}"]
        line = f"  M={m:3d}: " + " | ".join(cells)
        print(line, flush=True)
        SUMMARY.append(line)


# --- tile sweep: every kernel of the layer alone at each bucket, then the chain with the best of each
SWEEP_ROWS = tuple(int(r) for r in os.environ.get("PETAL_SWEEP_ROWS", "16,32,64,128").split(","))
ROLE_SHAPES = {"qkv": (QKV_WIDTH, HIDDEN), "gate_up": (2 * INTER, HIDDEN), "o": (HIDDEN, Q_SIZE),
               "down": (HIDDEN, INTER)}  # weight [N, K]


def sweep_candidates(m: int) -> dict[str, list[object]]:
    from petal.engine.layers.skinny_linear import GemmTiles

    block_ms = [b for b in (16, 32, 64, 128) if min(m, 64) <= b <= max(m, 64)]  # 64: wgmma's row tile
    norm = [GemmTiles(bm, bn, bk, 1, nw, st) for bm in block_ms for bn in (16, 32, 64) for bk in (64, 128)
            for nw, st in ((4, 3), (4, 4), (8, 3))]
    add = [GemmTiles(bm, bn, bk, sk, nw, st) for bm in block_ms for bn in (16, 32, 64) for bk in (64, 128)
           for sk in (2, 4, 8) for nw, st in ((4, 3), (4, 4))]
    return {"qkv": list(norm), "gate_up": list(norm), "o": list(add), "down": list(add)}


class RoleInputs:
    """One role's inputs at ``m`` rows and ``count`` distinct weights; ``call(tiles, i)`` runs weight ``i``."""

    def __init__(self, role: str, m: int, count: int) -> None:
        from petal.engine.layers.skinny_linear import NormInput

        n, k = ROLE_SHAPES[role]
        self.role, self.m = role, m
        self.weights = [torch.randn(n, k, device=CUDA, dtype=BF16) * 0.03 for _ in range(count)]
        self.g = (torch.rand(HIDDEN, device=CUDA) + 0.5).to(BF16)
        self.x = torch.randn(m, k, device=CUDA, dtype=BF16)
        self.res = torch.randn(m, HIDDEN, device=CUDA, dtype=BF16)
        parts = HIDDEN // 32  # the norm input as a 32-column linear_add leaves it
        self.norm_in = NormInput(torch.randn(m, HIDDEN, device=CUDA, dtype=BF16),
                                 torch.rand(parts, m, device=CUDA) * 10)

    def call(self, tiles: object, i: int) -> None:
        from petal.engine.layers.skinny_linear import GemmTiles, linear_add, norm_linear

        assert isinstance(tiles, GemmTiles)
        w = self.weights[i]
        if self.role in ("qkv", "gate_up"):
            norm_linear(self.norm_in, EPS, w, swiglu=self.role == "gate_up", pdl=True, tiles=tiles)
        else:
            linear_add(self.x, w, self.res, out=self.res, norm_weight=self.g, pdl=True, tiles=tiles)


def _compile_share(share: list[tuple[int, str, object]]) -> list[str]:
    """Worker process: launch each (rows, role, tiles) once so Triton compiles it into the shared disk cache."""
    failed = []
    inputs: dict[tuple[int, str], RoleInputs] = {}
    for m, role, tiles in share:
        key = (m, role)
        if key not in inputs:
            inputs[key] = RoleInputs(role, m, 1)
        try:
            inputs[key].call(tiles, 0)
            torch.cuda.synchronize()
        except Exception as exc:
            failed.append(f"{m} {role} {tiles}: {type(exc).__name__}")
    return failed


def precompile(cases: list[tuple[int, str, object]], workers: int = 14) -> None:
    """Compile every case in worker processes (Triton's on-disk cache), so the timing loop only loads them."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    started = time.perf_counter()
    shares = [cases[i::workers] for i in range(workers)]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        failed = [f for part in pool.map(_compile_share, shares) for f in part]
    print(f"  compiled {len(cases)} variants in {time.perf_counter() - started:.1f} s ({len(failed)} failed)",
          flush=True)


def section_skinny_sweep() -> None:
    """Per bucket of SWEEP_ROWS: each of the four kernels alone over its tile candidates (device us a call,
    28 distinct weights in a graph), the chain with the best of each against today's path and the default
    tiles, and the kernels' accuracy at the chosen tiles. Leaves the best in
    ``skinny_linear.BUCKET_TILES`` for the sections that follow in this process (engine_pplx)."""
    from petal.engine.layers import skinny_linear
    from petal.engine.layers.skinny_linear import LayerTiles

    cases = [(m, role, t) for m in SWEEP_ROWS for role, cands in sweep_candidates(m).items() for t in cands]
    precompile(cases)
    chain_for = layer_chains()
    for m in SWEEP_ROWS:
        best: dict[str, object] = {}
        for role, cands in sweep_candidates(m).items():
            inputs = RoleInputs(role, m, LAYERS)
            timed = []
            for tiles in cands:
                def run(t: object = tiles) -> None:
                    for i in range(LAYERS):
                        inputs.call(t, i)
                try:
                    timed.append((graph_us_per_call(run, LAYERS), tiles))
                except Exception as exc:
                    print(f"    M={m} {role} {tiles}: {type(exc).__name__}")
            timed.sort(key=lambda c: c[0])
            best[role] = timed[0][1]
            for us, tiles in timed[:3]:
                line = f"  M={m:3d} {role:<8} {us:6.2f} us  {tiles}"
                print(line)
                SUMMARY.append(line)
        chosen = LayerTiles(**best)  # type: ignore[arg-type]
        today, skinny = chain_for(m)
        us_today, us_default = graph_us_per_call(today, LAYERS), graph_us_per_call(skinny(True), LAYERS)
        us_swept = graph_us_per_call(skinny(True, chosen), LAYERS)
        line = f"  chain M={m:3d} (us/layer, PDL): today {us_today:.2f} | skinny BUCKET_TILES {us_default:.2f}" \
               f" | skinny swept tiles {us_swept:.2f}"
        print(line, flush=True)
        SUMMARY.append(line)
        if us_swept > us_default:  # the best kernels one by one need not chain best
            chosen = skinny_linear.layer_tiles(m)
        skinny_linear.BUCKET_TILES[m] = chosen
        line = f"  BUCKET_TILES[{m}] = {chosen}"
        print(line)
        SUMMARY.append(line)
    check_skinny((33, 50, 64, 65, 100, 128))


def section_deep_k() -> None:
    """Deeper K steps for the four skinny kernels (fewer dependent iterations of the K loop, more bytes in
    flight a program), per bucket of SWEEP_ROWS: each role alone over block_k x num_stages around today's
    tiles (us a call, 28 distinct weights in a graph), the 28-layer chain with today's tiles and with the
    best of each (taking turns), then the engine's L1 with both tile sets (two engines in one process,
    taking turns) and the cosine between their vectors. Keeps the better chain's tiles in ``BUCKET_TILES``."""
    from dataclasses import replace

    from petal.engine.layers import skinny_linear
    from petal.engine.layers.skinny_linear import LayerTiles

    today_tiles = dict(skinny_linear.BUCKET_TILES)
    roles = ("qkv", "o", "gate_up", "down")
    cases = []
    for m in SWEEP_ROWS:
        for role in roles:
            base = getattr(today_tiles[m], role)
            cases += [(m, role, replace(base, block_k=bk, num_stages=st)) for bk in (128, 256, 512) for st in (2, 3, 4)]
    precompile(cases)
    chain_for = layer_chains()
    chosen_tiles = dict(today_tiles)
    for m in SWEEP_ROWS:
        best = {}
        for role in roles:
            inputs = RoleInputs(role, m, LAYERS)
            timed = []
            for mm, r, tiles in cases:
                if mm != m or r != role:
                    continue
                def run(t: object = tiles) -> None:
                    for i in range(LAYERS):
                        inputs.call(t, i)
                try:
                    timed.append((graph_us_per_call(run, LAYERS), tiles))
                except Exception as exc:  # more shared memory than a program has
                    print(f"    M={m} {role} {tiles}: {type(exc).__name__}")
            base = getattr(today_tiles[m], role)
            base_us = next(us for us, t in timed if t == base)
            timed.sort(key=lambda c: c[0])
            best[role] = timed[0][1]
            line = (f"  M={m:3d} {role:<8} today {base_us:6.2f} us | best " + " | ".join(
                f"{us:6.2f} us k {t.block_k} st {t.num_stages}" for us, t in timed[:3]))
            print(line, flush=True)
            SUMMARY.append(line)
        candidate = replace(today_tiles[m], **best)
        _, skinny = chain_for(m)
        us: dict[str, list[float]] = {"today": [], "deep": []}
        for _ in range(2):
            us["today"].append(graph_us_per_call(skinny(True, today_tiles[m]), LAYERS))
            us["deep"].append(graph_us_per_call(skinny(True, candidate), LAYERS))
        if min(us["deep"]) < min(us["today"]):
            chosen_tiles[m] = candidate
        line = (f"  chain M={m:3d} us/layer today {us['today'][0]:.2f}/{us['today'][1]:.2f} | deep "
                f"{us['deep'][0]:.2f}/{us['deep'][1]:.2f} -> {chosen_tiles[m]}")
        print(line, flush=True)
        SUMMARY.append(line)

    def use(tiles: dict[int, LayerTiles]) -> Callable[[], None]:
        def setup() -> None:  # read when each bucket's graph is captured
            skinny_linear.BUCKET_TILES.clear()
            skinny_linear.BUCKET_TILES.update(tiles)
        return setup

    engines_taking_turns({"today": use(today_tiles), "deep": use(chosen_tiles)}, (16, 30, 60, 128), 3)


def section_deep16() -> None:
    """The 16-row chain (us a layer, PDL) with deeper K steps in one kernel at a time (deep_k's best of each
    chained slower than today's tiles), taking turns over three rounds."""
    from dataclasses import replace

    from petal.engine.layers import skinny_linear

    today = skinny_linear.BUCKET_TILES[16]
    variants = {"today": today,
                "qkv k256 st4": replace(today, qkv=replace(today.qkv, block_k=256)),
                "qkv k512 st3": replace(today, qkv=replace(today.qkv, block_k=512, num_stages=3)),
                "gate_up k256 st3": replace(today, gate_up=replace(today.gate_up, block_k=256, num_stages=3)),
                "qkv+gate_up k256": replace(today, qkv=replace(today.qkv, block_k=256),
                                            gate_up=replace(today.gate_up, block_k=256, num_stages=3))}
    _, skinny = layer_chains()(16)
    us: dict[str, list[float]] = {}
    for _ in range(3):
        for label, tiles in variants.items():
            us.setdefault(label, []).append(graph_us_per_call(skinny(True, tiles), LAYERS))
    for label, cells in us.items():
        line = f"  chain M= 16 {label:<18} " + " / ".join(f"{c:.2f}" for c in cells) + " us a layer"
        print(line)
        SUMMARY.append(line)


WARMUP_CHILD = r"""
import sys, time
import torch
from petal.bench.shapes import shape
from petal.engine.layers import warmup
from petal.engine.layers.skinny_linear import SkinnyOptions
from petal.engine.models import model_class_for
skinny, threads = int(sys.argv[1]), int(sys.argv[2])
torch.empty(1, device="cuda")
s = shape("pplx-embed-0.6b")
cfg = model_class_for(s.hf_config).config_from_hf(s.hf_config)
warmup.WARMUP_THREADS = threads
started = time.perf_counter()
thread = warmup.start_warmup(cfg, torch.bfloat16, torch.device("cuda"), skinny, SkinnyOptions(True, True))
thread.join()
print(time.perf_counter() - started)
"""


def section_warmup() -> None:
    """The Triton warm-up (engine/layers/warmup.py) of the pplx-embed-0.6b shape on an empty Triton cache
    (a bare host), in fresh processes: skinny layers for the 16-token bucket only / for every bucket up to
    128 tokens, compiled by one thread / by the warm-up's threads."""
    import subprocess
    import tempfile

    from petal.engine.layers.warmup import WARMUP_THREADS

    print("\nTriton warm-up on an empty cache (s, fresh process each, 2 runs)")
    for skinny, threads in ((16, 1), (128, 1), (128, WARMUP_THREADS), (16, WARMUP_THREADS)):
        times = []
        for _ in range(2):
            with tempfile.TemporaryDirectory() as cache:
                out = subprocess.run([sys.executable, "-c", WARMUP_CHILD, str(skinny), str(threads)],
                                     capture_output=True, text=True, env={**os.environ, "TRITON_CACHE_DIR": cache})
                times.append(float(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else float("nan"))
                if out.returncode:
                    print(out.stderr[-2000:])
        line = f"  skinny up to {skinny:3d} tokens, {threads} thread(s): " + " / ".join(f"{t:.2f}" for t in times)
        print(line, flush=True)
        SUMMARY.append(line)


def section_buckets(name: str = "pplx-embed-0.6b") -> None:
    spec, model = native_model(name)
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


def section_whole() -> None:
    """The fused attention with every token slot as one key block (``whole``) against its blocked loop:
    per layer in a graph of 28 distinct inputs, then engine L1 with ``WHOLE_MAX_TOKENS`` 64 and 0 taking turns."""
    from petal.engine.layers import small_attention as module
    from petal.engine.layers.rotary import RotaryEmbedding

    hq, hk, d = 16, 8, 128
    table = RotaryEmbedding(d, 4096, 1e6).cos_sin(CUDA)
    weights = (torch.rand(2, d, device=CUDA) + 0.5).to(BF16)
    for lengths in ([16], [30], [60], [8, 8], [5, 20, 3]):
        _, layout, buf = padded_inputs(lengths)
        sl = layout.slices()
        seq_ids, cu, positions = buf[sl["token_seq_ids"]], buf[sl["cu_seqlens"]], buf[sl["positions"]]
        t = layout.num_tokens
        qkvs = [torch.randn(t, (hq + 2 * hk) * d, device=CUDA, dtype=BF16) for _ in range(LAYERS)]
        cells, outs = [], []
        for whole in (False, True, False, True):
            def run(whole: bool = whole) -> None:
                for x in qkvs:
                    module.small_attention(x, seq_ids, cu, num_heads=hq, num_kv_heads=hk, head_dim=d, causal=False,
                                           scale=d**-0.5, positions=positions, rope_table=table,
                                           qk_norm_weights=weights, eps=1e-6, whole=whole)

            cells.append(graph_us_per_call(run, LAYERS))
            outs.append(module.small_attention(qkvs[0], seq_ids, cu, num_heads=hq, num_kv_heads=hk, head_dim=d,
                                               causal=False, scale=d**-0.5, positions=positions, rope_table=table,
                                               qk_norm_weights=weights, eps=1e-6, whole=whole).float())
        real = sum(lengths)
        err = float((outs[1][:real] - outs[0][:real]).abs().max())
        line = (f"  attention bucket {t:3d} {lengths}: blocked {cells[0]:.2f}/{cells[2]:.2f} | whole "
                f"{cells[1]:.2f}/{cells[3]:.2f} us/layer | max diff {err:.4f}")
        print(line, flush=True)
        SUMMARY.append(line)

    def limit(tokens: int) -> Callable[[], None]:
        def setup() -> None:  # read when each bucket's graph is captured
            module.WHOLE_MAX_TOKENS = tokens
        return setup

    default = module.WHOLE_MAX_TOKENS
    engines_taking_turns({"whole": limit(default), "blocked": limit(0)}, (16, 30, 60), 2)
    module.WHOLE_MAX_TOKENS = default


def section_gaps(calls: int = 400) -> None:
    """What a lone server request pays that back-to-back L1 does not: a 128-token step (launch -> result)
    after the host idled ``gap`` ms (sleeping, spinning so the core stays busy, or spinning on ``time.sleep(0)``
    as a server thread could spin while idle: tried, not taken), and the server's two
    thread hand-offs (a ``Condition`` wake-up of a waiting engine thread, then the step, then a wake-up of
    the waiting caller), each with the same gaps. p50 us of each."""
    import threading

    spec, model = native_model("pplx-embed-0.6b")
    engine = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=16384), model=model)
    batch = PackedBatch.from_sequences(random_docs(np.array([128]), spec.config.vocab_size, seed=128))
    for _ in range(5):
        engine.step(batch).result()

    def idle(gap_s: float, spin: str) -> None:
        end = time.perf_counter() + gap_s
        if spin == "spin":  # holding the GIL
            while time.perf_counter() < end:
                pass
        elif spin == "yield":  # the GIL released every turn
            while time.perf_counter() < end:
                time.sleep(0)
        elif gap_s:
            time.sleep(gap_s)

    def direct(gap_s: float, spin: str) -> dict[str, float]:
        times = []
        for _ in range(calls):
            idle(gap_s, spin)
            started = time.perf_counter()
            engine.step(batch).result()
            times.append(time.perf_counter() - started)
        return {"step": float(np.median(times)) * 1e6}

    def handed(gap_s: float, spin: str) -> dict[str, float]:
        cond, done = threading.Condition(), threading.Event()
        box: dict[str, float] = {}
        todo: list[float] = []

        def worker() -> None:
            while True:
                with cond:
                    while not todo:
                        cond.wait()
                    sent = todo.pop()
                if sent < 0:
                    return
                box["woke"] = time.perf_counter() - sent
                started = time.perf_counter()
                engine.step(batch).result()
                box["step"] = time.perf_counter() - started
                box["answered"] = time.perf_counter()
                done.set()

        thread = threading.Thread(target=worker)
        thread.start()
        rows: dict[str, list[float]] = {"woke": [], "step": [], "back": [], "total": []}
        for _ in range(calls):
            idle(gap_s, spin)
            done.clear()
            sent = time.perf_counter()
            with cond:
                todo.append(sent)
                cond.notify()
            done.wait()
            back = time.perf_counter()
            for key, value in (("woke", box["woke"]), ("step", box["step"]), ("back", back - box["answered"]),
                               ("total", back - sent)):
                rows[key].append(value)
        with cond:
            todo.append(-1.0)
            cond.notify()
        thread.join()
        return {key: float(np.median(v)) * 1e6 for key, v in rows.items()}

    for gap_ms in (0.0, 0.3, 1.0, 3.0, 0.0, 0.3, 1.0, 3.0):  # twice: the spread between passes
        for how in ("sleep", "spin", "yield"):
            if how != "sleep" and not gap_ms:
                continue
            for label, fn in (("direct", direct), ("handed", handed)):
                r = fn(gap_ms / 1000, how)
                line = f"  gaps {label} {how:<5} {gap_ms:3.1f} ms: " + " ".join(f"{k} {v:7.1f}" for k, v in r.items())
                print(line)
                SUMMARY.append(line)
    release(engine)


def main() -> None:
    sections = sys.argv[1:] or ["kernels", "gemm", "skinny", "engine", "buckets"]
    torch.manual_seed(0)
    run_sections({"engine": section_engine, "kernels": section_kernels, "gemm": section_gemm,
             "buckets": section_buckets, "skinny": section_skinny, "skinny_sweep": section_skinny_sweep,
             "engine_pplx": lambda: section_engine(("pplx-embed-0.6b",)),
             "warmup": section_warmup, "whole": section_whole, "deep_k": section_deep_k,
             "deep16": section_deep16, "gaps": section_gaps,
             "engine_ab": lambda: section_engine(
                 ("pplx-embed-0.6b",), ("default", "skinny128", "default2", "skinny128-2"), (16, 30, 60, 128)),
             "engine_buckets": lambda: section_engine(
                 ("pplx-embed-0.6b",), ("off", "att+mlp", "default", "skinny32", "skinny64", "skinny128"),
                 (16, 30, 60, 128))}, sections, SUMMARY)


if __name__ == "__main__":
    main()
