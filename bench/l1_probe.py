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
    def config(attention: int, mlp: int) -> EngineConfig:
        return EngineConfig(device="cuda", dtype="bfloat16", token_budget=16384, small_attention_tokens=attention,
                            fused_mlp_tokens=mlp)

    return {"off": config(0, 0), "attention": config(128, 0), "mlp": config(0, 32),
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
    sections = sys.argv[1:] or ["kernels", "gemm", "engine", "buckets"]
    torch.manual_seed(0)
    for name in sections:
        started = time.perf_counter()
        try:
            {"engine": section_engine, "kernels": section_kernels, "gemm": section_gemm,
             "buckets": section_buckets}[name]()
        except Exception:
            traceback.print_exc()
            SUMMARY.append(f"  {name}: FAILED (traceback above)")
        print(f"[{name}: {time.perf_counter() - started:.1f} s]", flush=True)
    print("\n=== summary")
    print("\n".join(SUMMARY))


if __name__ == "__main__":
    main()
