"""Triton kernels for what FlashInfer's prebuilt modules do not fuse.

``qk_norm_rope_``: Qwen3's per-head RMSNorm of q and k followed by NeoX RoPE, in place on the
fused QKV projection output: one read and one write of q and k instead of ~20 elementwise kernels
(contiguous copies, two norms, slices, products, concatenations). Math in fp32, one rounding.

``add_layer_norm``: BERT's post-norm ``LayerNorm(x + residual)`` in one pass (three instead of five
trips through memory); ``residual`` may also be one ``[hidden]`` row added to every row (the dense
layer's bias, when the GEMM already added the residual stream: ``engine/models/bert.py``).

Also the small-batch path's ``gate_up_silu_kernel`` (``engine/layers/fused_mlp.py``); its fused
attention kernel calls a helper, so it lives in ``engine/layers/triton_attention.py``.
"""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def triton_available() -> bool:
    if os.environ.get("PETAL_FUSED_KERNELS", "1") == "0" or not torch.cuda.is_available():
        return False
    try:
        import triton
        import triton.language  # noqa: F401
    except Exception:  # not installed (CPU machines): torch ops serve
        return False
    return True


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def qk_norm_rope_kernel(qkv_ptr, stride_t, pos_ptr, table_ptr, w_ptr, eps,
                            Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, HALF: tl.constexpr,
                            BLOCK_H: tl.constexpr):
        token = tl.program_id(0)
        is_k = tl.program_id(1)
        heads = tl.where(is_k == 1, K_HEADS, Q_HEADS)
        col0 = is_k * (Q_HEADS * 2 * HALF)
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, HALF)[None, :]
        mask = h < heads
        base = qkv_ptr + token.to(tl.int64) * stride_t + col0 + h * (2 * HALF)
        x1 = tl.load(base + d, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(base + HALF + d, mask=mask, other=0.0).to(tl.float32)
        inv_rms = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
        w_row = w_ptr + is_k * (2 * HALF)  # weights stacked [2, D]: q_norm, k_norm
        w1 = tl.load(w_row + d).to(tl.float32)
        w2 = tl.load(w_row + HALF + d).to(tl.float32)
        x1 = x1 * inv_rms[:, None] * w1
        x2 = x2 * inv_rms[:, None] * w2
        pos = tl.load(pos_ptr + token).to(tl.int64)
        cos = tl.load(table_ptr + pos * (2 * HALF) + d)
        sin = tl.load(table_ptr + pos * (2 * HALF) + HALF + d)
        out_ty = qkv_ptr.dtype.element_ty
        tl.store(base + d, (x1 * cos - x2 * sin).to(out_ty), mask=mask)
        tl.store(base + HALF + d, (x2 * cos + x1 * sin).to(out_ty), mask=mask)

    return qk_norm_rope_kernel


def qk_norm_rope_(qkv: torch.Tensor, positions: torch.Tensor, table: torch.Tensor, weights: torch.Tensor,
                  eps: float, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    """In place on ``qkv [T, (Hq + 2 Hk) * D]``: RMSNorm then RoPE of the q and k heads.

    ``positions [T]`` int32, ``table [max_pos, D]`` float32 (cos | sin halves), ``weights [2, D]``
    (q_norm, k_norm), contiguous.
    """
    assert qkv.stride(-1) == 1 and head_dim % 2 == 0 and (head_dim // 2) & (head_dim // 2 - 1) == 0
    num_tokens = qkv.shape[0]
    if num_tokens == 0:
        return
    block_h = 1 << (max(num_heads, num_kv_heads) - 1).bit_length()
    _kernel()[(num_tokens, 2)](qkv, qkv.stride(0), positions, table, weights, eps,
                               Q_HEADS=num_heads, K_HEADS=num_kv_heads, HALF=head_dim // 2, BLOCK_H=block_h)


@functools.cache
def _add_ln_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def add_layer_norm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr,
                              ONE_ROW: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        r_row = r_ptr if ONE_ROW else r_ptr + row * n_cols  # ONE_ROW: a [hidden] vector added to every row
        x += tl.load(r_row + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.where(mask, x, 0.0)  # NOTE: rounds x + residual to the activation dtype first, as torch does
        x = x.to(out_ptr.dtype.element_ty).to(tl.float32)
        mean = tl.sum(x, axis=0) / n_cols
        centered = tl.where(mask, x - mean, 0.0)
        inv_std = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * n_cols + cols, (centered * inv_std * w + b).to(out_ptr.dtype.element_ty), mask=mask)

    return add_layer_norm_kernel


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """``LayerNorm(x + residual)`` over the last dim of ``[T, hidden]`` contiguous tensors; ``residual`` is
    ``[T, hidden]`` or one ``[hidden]`` row (broadcast over the rows)."""
    one_row = residual.dim() == 1
    assert x.is_contiguous() and residual.is_contiguous()
    assert residual.shape == (x.shape[-1],) if one_row else residual.shape == x.shape
    out = torch.empty_like(x)
    num_rows, n_cols = x.shape
    if num_rows:
        _add_ln_kernel()[(num_rows,)](x, residual, weight, bias, out, n_cols, eps,
                                      BLOCK=1 << (n_cols - 1).bit_length(), ONE_ROW=one_row)
    return out


@functools.cache
def gate_up_silu_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def gate_up_silu_kernel(x_ptr, w_ptr, out_ptr, num_tokens, stride_x, stride_out,
                            INTER: tl.constexpr, K: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        row_mask = rows[:, None] < num_tokens
        x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_x + ks[None, :]
        g_ptrs = w_ptr + cols.to(tl.int64)[:, None] * K + ks[None, :]
        u_ptrs = g_ptrs + INTER * K
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, K, BLOCK_K):
            x = tl.load(x_ptrs, mask=row_mask, other=0.0)
            acc_g = tl.dot(x, tl.trans(tl.load(g_ptrs)), acc_g)
            acc_u = tl.dot(x, tl.trans(tl.load(u_ptrs)), acc_u)
            x_ptrs += BLOCK_K
            g_ptrs += BLOCK_K
            u_ptrs += BLOCK_K
        ty = out_ptr.dtype.element_ty
        gate = acc_g.to(ty).to(tl.float32)  # NOTE: rounded as the unfused GEMM's output, then SwiGLU in fp32
        up = acc_u.to(ty).to(tl.float32)
        out = gate / (1.0 + tl.exp(-gate)) * up
        out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :]
        tl.store(out_ptrs, out.to(ty), mask=row_mask)

    return gate_up_silu_kernel
