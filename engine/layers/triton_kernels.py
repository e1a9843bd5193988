"""Triton kernels for what FlashInfer's prebuilt modules do not fuse.

``qk_norm_rope_``: Qwen3's per-head RMSNorm of q and k followed by NeoX RoPE, in place on the
fused QKV projection output: one read and one write of q and k instead of ~20 elementwise kernels
(contiguous copies, two norms, slices, products, concatenations). Math in fp32, one rounding.

``add_layer_norm``: BERT's post-norm ``LayerNorm(x + residual)`` in one pass (three instead of five
trips through memory).
"""

from __future__ import annotations

import functools
import os
import threading
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from petal.engine.config import ModelConfig


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
    def add_layer_norm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        x += tl.load(r_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
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
    """``LayerNorm(x + residual)`` over the last dim of ``[T, hidden]`` contiguous tensors."""
    assert x.is_contiguous() and residual.is_contiguous() and x.shape == residual.shape
    out = torch.empty_like(x)
    num_rows, n_cols = x.shape
    if num_rows:
        _add_ln_kernel()[(num_rows,)](x, residual, weight, bias, out, n_cols, eps,
                                      BLOCK=1 << (n_cols - 1).bit_length())
    return out


_warmups: dict[tuple[object, ...], threading.Thread] = {}


def start_warmup(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> threading.Thread | None:
    """Compile (or load from Triton's on-disk cache) the Triton kernels ``cfg``'s model will run, in a
    background thread, so it overlaps the weight load instead of delaying the first step (a cold
    compile took ~1.4 s on the H200 host). Idempotent; ``join()`` the thread before any CUDA graph
    capture. ``None`` when no Triton kernel will run.
    """
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16) or not triton_available():
        return None
    key = (cfg.architecture, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, dtype, str(device))
    thread = _warmups.get(key)
    if thread is None:
        thread = threading.Thread(target=_warm, args=(cfg, dtype, device), name="petal-kernel-warmup", daemon=True)
        _warmups[key] = thread
        thread.start()
    return thread


def _warm(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
    # NOTE: a failure here is ignored: the real call compiles again and raises where it can be reported.
    # Dummy inputs match the real calls' dtypes, strides and sizes, so Triton specialises (and caches)
    # the very kernel the model launches.
    try:
        with torch.inference_mode():
            if cfg.architecture == "qwen3":
                width = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
                qk_norm_rope_(torch.zeros(1, width, dtype=dtype, device=device),
                              torch.zeros(1, dtype=torch.int32, device=device),
                              torch.zeros(2, cfg.head_dim, dtype=torch.float32, device=device),
                              torch.zeros(2, cfg.head_dim, dtype=dtype, device=device), 1e-6,
                              cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
            else:  # BERT family: post-norm LayerNorm(x + residual)
                x = torch.zeros(1, cfg.hidden_size, dtype=dtype, device=device)
                add_layer_norm(x, torch.zeros_like(x), torch.ones(cfg.hidden_size, dtype=dtype, device=device),
                               torch.zeros(cfg.hidden_size, dtype=dtype, device=device), 1e-12)
            torch.cuda.synchronize(device)
    except Exception:
        pass
