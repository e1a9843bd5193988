"""Large-bucket attention alone, by backend: what a T1/T2 step's attention would cost with each kernel.

    python3 bench/attention_backends_probe.py        (on the GPU host)

Per shape (pplx-embed-0.6b: 16 query heads, 8 KV heads, head dim 128; bge-m3: 16/16/64) and length mix
(32 x 512 tokens as T1; lognormal lengths as T2), ms per call (CUDA events over repeated calls, eager) and
TFLOP/s (4 * sum(len^2) * head_dim * heads), and the largest difference to FlashInfer's fa3 output:
FlashInfer fa3 and fa2 (ragged prefill, as the engine plans it), torch SDPA's cuDNN and flash backends
on the padded batch (uniform lengths only), and torch's private varlen cuDNN/flash entry points where
this torch has them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

DEVICE = torch.device("cuda")
DTYPE = torch.bfloat16


def timed(fn: Callable[[], object], reps: int = 30) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def flashinfer_run(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   cu: torch.Tensor, heads: int, kv_heads: int, dim: int) -> Callable[[], torch.Tensor]:
    import flashinfer

    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=backend)
    cu_cpu = cu.cpu()
    wrapper.plan(cu_cpu, cu_cpu, heads, kv_heads, dim, causal=False, sm_scale=dim ** -0.5,
                 q_data_type=DTYPE, kv_data_type=DTYPE)
    return lambda: wrapper.run(q, k, v)



def case(heads: int, kv_heads: int, dim: int, lens: np.ndarray) -> list[tuple[str, float, float, float]]:
    """(backend, ms, TFLOP/s, max difference to fa3) for one shape and length mix."""
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=DEVICE)
    tokens = int(lens.sum())
    q = torch.randn(tokens, heads, dim, device=DEVICE, dtype=DTYPE)
    k = torch.randn(tokens, kv_heads, dim, device=DEVICE, dtype=DTYPE)
    v = torch.randn(tokens, kv_heads, dim, device=DEVICE, dtype=DTYPE)
    flops = 4 * float((lens.astype(np.float64) ** 2).sum()) * dim * heads
    scale = dim ** -0.5
    runs: dict[str, Callable[[], torch.Tensor]] = {}
    for backend in ("fa3", "fa2"):
        try:
            runs[f"flashinfer {backend}"] = flashinfer_run(backend, q, k, v, cu, heads, kv_heads, dim)
        except Exception as exc:  # a backend this build lacks
            print(f"  flashinfer {backend}: {type(exc).__name__}: {str(exc)[:120]}")
    group = heads // kv_heads
    k_full = k.repeat_interleave(group, dim=1) if group > 1 else k
    v_full = v.repeat_interleave(group, dim=1) if group > 1 else v
    if len(set(lens.tolist())) == 1:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        b, seq = len(lens), int(lens[0])
        qp, kp, vp = (t.view(b, seq, heads, dim).transpose(1, 2) for t in (q, k_full, v_full))

        def sdpa(backend_enum: SDPBackend) -> Callable[[], torch.Tensor]:
            def run() -> torch.Tensor:
                with sdpa_kernel(backend_enum):
                    out = torch.nn.functional.scaled_dot_product_attention(qp, kp, vp)
                return out.transpose(1, 2).reshape(tokens, heads, dim)
            return run

        runs["sdpa cudnn (padded)"] = sdpa(SDPBackend.CUDNN_ATTENTION)
        runs["sdpa flash (padded)"] = sdpa(SDPBackend.FLASH_ATTENTION)
    max_len = int(lens.max())
    cudnn_op = getattr(torch.ops.aten, "_cudnn_attention_forward", None)
    flash_op = getattr(torch.ops.aten, "_flash_attention_forward", None)
    if cudnn_op is not None:
        runs["aten cudnn varlen"] = lambda: cudnn_op(q, k_full, v_full, None, cu, cu, max_len, max_len, False, 0.0,
                                                     False, False, scale=scale)[0].reshape(tokens, heads, dim)
    if flash_op is not None:
        runs["aten flash varlen"] = lambda: flash_op(q, k, v, cu, cu, max_len, max_len, 0.0, False, False,
                                                     scale=scale)[0].reshape(tokens, heads, dim)
    reference = runs["flashinfer fa3"]().float() if "flashinfer fa3" in runs else None
    out_rows = []
    for label, fn in runs.items():
        try:
            out = fn()
            diff = float((out.float() - reference).abs().max()) if reference is not None else float("nan")
            ms = timed(fn)
        except Exception as exc:
            print(f"  {heads}/{kv_heads}/{dim} {label}: {type(exc).__name__}: {str(exc)[:160]}")
            continue
        out_rows.append((label, ms, flops / ms / 1e9, diff))
    return out_rows


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    for name in ("_cudnn_attention_forward", "_flash_attention_forward"):
        op = getattr(torch.ops.aten, name, None)
        print(f"  aten.{name}: {op.default._schema if op is not None else 'absent'}")
    mixes = {"32x512": np.full(32, 512)}
    lengths = np.clip(rng.lognormal(np.log(300), 0.7, 200).astype(int), 8, 512)
    mixes["lognormal"] = lengths[np.cumsum(lengths) <= 16384]
    rows = []
    for shape, (heads, kv_heads, dim) in {"pplx-embed-0.6b": (16, 8, 128), "bge-m3": (16, 16, 64)}.items():
        for mix, lens in mixes.items():
            rows += [(shape, mix, *row) for row in case(heads, kv_heads, dim, lens)]
    print("| shape | lengths | backend | ms a layer | TFLOP/s | max diff to fa3 |")
    print("|---|---|---|---|---|---|")
    for shape, mix, label, ms, tflops, diff in rows:
        print(f"| {shape} | {mix} | {label} | {ms:.4f} | {tflops:.0f} | {diff:.2e} |")


if __name__ == "__main__":
    main()
