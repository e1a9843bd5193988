"""Qwen3's gate/up projection with SwiGLU in the epilogue for throughput buckets (Hopper: TMA, Triton).

``gate_up_silu_tma(x, w)`` = ``silu_and_mul(x @ w.T)`` for ``w = [gate | up]`` (``[2 * inter, hidden]``,
the fused ``gate_up_proj`` weight, unchanged layout). One program per SM walks ``BM x BN`` output tiles;
each K step loads the ``x`` tile and the matching gate and up weight tiles with TMA descriptors and runs
two ``tl.dot``s; the epilogue rounds both products to the activation dtype (as the unfused GEMM's
output is rounded) and writes ``silu(gate) * up`` only, so the ``[T, 2 * inter]`` product never goes
through memory and the separate activation kernel is gone.

Measured on the H200 (``python3 bench/swiglu_tma_probe.py``, pplx-embed-0.6b shape, 28 layers' distinct
weights inside a CUDA graph): 16384 rows 366.9 against 393.9 us a layer for cuBLAS + ``silu_and_mul``
(cuBLAS's GEMM alone: 329.7 us); 4096 rows 96.6 against 101.2 us. The small-batch kernel
(``engine/layers/fused_mlp.py``, pointer loads, one tile a program) lost at these sizes (411.5 against
380.7 us), so small buckets keep that one and large buckets use this one from ``EngineConfig.tma_mlp_tokens``.
"""

from __future__ import annotations

import functools

import torch

BM, BN, BK = 128, 128, 64  # output rows, output (intermediate) columns, hidden depth per K step
NUM_STAGES, NUM_WARPS, GROUP_M = 3, 8, 8  # best of the probe's candidates at 4096 and 16384 rows


def fits(hidden_size: int, intermediate_size: int) -> bool:
    """Whether the tiles divide the model's sizes (the descriptors need 16-byte rows too)."""
    return hidden_size % BK == 0 and intermediate_size % BN == 0


@functools.cache
def tma_available(device_index: int) -> bool:
    """sm90+ and a Triton with host-side tensor descriptors."""
    if torch.cuda.get_device_capability(device_index)[0] < 9:
        return False
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except Exception:  # an older Triton: the cuBLAS path serves
        return False
    return True


@functools.cache
def _num_sms(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


@functools.cache
def _kernel():
    import triton.language as tl
    from triton import jit

    @jit
    def gate_up_silu_tma_kernel(x_desc, w_desc, o_desc, num_tokens, num_programs, K: tl.constexpr,
                                INTER: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                                BK: tl.constexpr, GROUP_M: tl.constexpr, IS_BF16: tl.constexpr):
        num_m = tl.cdiv(num_tokens, BM)
        num_n: tl.constexpr = INTER // BN
        per_group: tl.constexpr = GROUP_M * num_n
        for tile in range(tl.program_id(0), num_m * num_n, num_programs):
            # NOTE: GROUP_M row tiles share each weight column tile while it is in L2
            first_m = (tile // per_group) * GROUP_M
            size_m = min(num_m - first_m, GROUP_M)
            off_m = (first_m + (tile % per_group) % size_m) * BM
            off_n = ((tile % per_group) // size_m) * BN
            gate = tl.zeros((BM, BN), dtype=tl.float32)
            up = tl.zeros((BM, BN), dtype=tl.float32)
            for k in range(0, K, BK):
                a = x_desc.load([off_m, k])  # rows past num_tokens read as zeros; their stores are clipped
                gate = tl.dot(a, w_desc.load([off_n, k]).T, gate)
                up = tl.dot(a, w_desc.load([INTER + off_n, k]).T, up)
            if IS_BF16:
                gate = gate.to(tl.bfloat16).to(tl.float32)
                up = up.to(tl.bfloat16).to(tl.float32)
                o_desc.store([off_m, off_n], (gate / (1.0 + tl.exp(-gate)) * up).to(tl.bfloat16))
            else:
                gate = gate.to(tl.float16).to(tl.float32)
                up = up.to(tl.float16).to(tl.float32)
                o_desc.store([off_m, off_n], (gate / (1.0 + tl.exp(-gate)) * up).to(tl.float16))

    return gate_up_silu_tma_kernel


def gate_up_silu_tma(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``silu(x @ gate.T) * (x @ up.T)``: ``x [T, hidden]``, ``weight [2 * inter, hidden]`` -> ``[T, inter]``.

    bf16 or fp16 on an sm90+ GPU (``tma_available``); ``weight`` contiguous, ``x`` with unit last stride and
    16-byte aligned rows; ``fits(hidden, inter)``.
    """
    from triton.tools.tensor_descriptor import TensorDescriptor

    num_tokens, hidden = x.shape
    inter = weight.shape[0] // 2
    assert weight.shape == (2 * inter, hidden) and weight.is_contiguous() and x.stride(1) == 1
    assert fits(hidden, inter) and x.dtype == weight.dtype in (torch.bfloat16, torch.float16)
    out = torch.empty(num_tokens, inter, dtype=x.dtype, device=x.device)
    if num_tokens:
        tiles = -(-num_tokens // BM) * (inter // BN)
        programs = min(tiles, _num_sms(x.device.index or 0))
        _kernel()[(programs,)](TensorDescriptor.from_tensor(x, [BM, BK]),
                               TensorDescriptor.from_tensor(weight, [BN, BK]),
                               TensorDescriptor.from_tensor(out, [BM, BN]), num_tokens, programs, K=hidden,
                               INTER=inter, BM=BM, BN=BN, BK=BK, GROUP_M=GROUP_M,
                               IS_BF16=x.dtype == torch.bfloat16, num_stages=NUM_STAGES, num_warps=NUM_WARPS)
    return out
