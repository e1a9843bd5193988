"""Varlen self-attention over packed sequences, behind one function.

Backends (chosen by ``make_attention_backend``):

- ``sdpa``: PyTorch SDPA once per sequence (CPU; the reference);
- ``torch``: ``torch.nn.attention.varlen.varlen_attn`` (CUDA, FlashAttention-2 inside PyTorch);
- ``flashinfer``: FlashInfer's ragged prefill (CUDA, primary; see ``engine/layers/flashinfer_attention.py``).

All take ``q [num_tokens, num_heads, head_dim]``, ``k``/``v [num_tokens, num_kv_heads, head_dim]``
and return ``[num_tokens, num_heads, head_dim]``; no sequence attends across its boundaries.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from petal.engine.context import ForwardContext


class AttentionBackend(Protocol):
    name: str
    capturable: bool  # can run inside a CUDA graph (plan() stays outside)

    def plan(self, ctx: ForwardContext) -> None:
        """Host-side preparation for one step (outside any CUDA graph)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        ...


def repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v with their heads repeated to q's head count (grouped-query attention), else unchanged."""
    if k.shape[1] == q.shape[1]:
        return k, v
    group = q.shape[1] // k.shape[1]
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
    """Self-attention of every packed sequence with itself: ``[num_tokens, heads, head_dim]``."""
    return ctx.attention.forward(q, k, v, ctx)


class SdpaAttention:
    """One SDPA call per sequence. Runs anywhere; the CPU path and the reference for the others."""

    name = "sdpa"
    capturable = False  # NOTE: loops over host offsets; a graph would bake in one batch's lengths

    def __init__(self, causal: bool, scale: float) -> None:
        self.causal = causal
        self.scale = scale

    def plan(self, ctx: ForwardContext) -> None:
        return None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        k, v = repeat_kv(q, k, v)
        # [num_tokens, heads, dim] -> [1, heads, num_tokens, dim]: per-sequence slices are then 4-D
        # views, which the CPU's fused SDPA kernel takes (3-D inputs fall back to the slow math path).
        q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        bounds = ctx.cu_seqlens_cpu.tolist()
        outs = []
        for start, end in itertools.pairwise(bounds):
            if end > start:
                outs.append(F.scaled_dot_product_attention(
                    q4[:, :, start:end], k4[:, :, start:end], v4[:, :, start:end],
                    is_causal=self.causal, scale=self.scale,
                ))
        if bounds[-1] < q.shape[0]:  # tokens past the last sequence (padding) attend nowhere
            outs.append(q4.new_zeros(1, q.shape[1], q.shape[0] - bounds[-1], q.shape[2]))
        return torch.cat(outs, dim=2)[0].transpose(0, 1)  # [num_tokens, heads, dim] (a view)


class TorchVarlenAttention:
    """``torch.nn.attention.varlen.varlen_attn`` (FlashAttention-2 in PyTorch, CUDA, fp16/bf16).

    Capturable in a CUDA graph: offsets are read on the device and ``max_seqlen`` is a host int
    (an upper bound under graphs).
    """

    name = "torch"
    capturable = True

    def __init__(self, causal: bool, scale: float) -> None:
        import inspect

        from torch.nn.attention.varlen import varlen_attn

        self._varlen_attn = varlen_attn
        self.causal = causal
        self.scale = scale
        # NOTE: torch 2.9 took is_causal=; 2.10+ take window_size=(-1, 0) for causal.
        params = inspect.signature(varlen_attn).parameters
        self._mask_kwargs: dict[str, Any] = (
            {"window_size": (-1, 0) if causal else (-1, -1)} if "window_size" in params else {"is_causal": causal}
        )

    def plan(self, ctx: ForwardContext) -> None:
        return None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        k, v = repeat_kv(q, k, v)  # NOTE: torch 2.11's varlen_attn has no enable_gqa
        out = self._varlen_attn(
            q, k, v, ctx.cu_seqlens, ctx.cu_seqlens, ctx.max_seqlen, ctx.max_seqlen,
            scale=self.scale, **self._mask_kwargs,
        )
        return cast(torch.Tensor, out)  # a tuple only when asked for auxiliary outputs (we do not)


def make_attention_backend(
    name: str,
    *,
    device: torch.device,
    dtype: torch.dtype,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    causal: bool,
    max_tokens: int,
    max_seqs: int,
    cuda_graphs: bool,
) -> AttentionBackend:
    """Pick an attention backend. ``auto``: FlashInfer on CUDA where it supports the head dim and
    dtype, else ``torch`` varlen on CUDA, else SDPA."""
    scale = head_dim**-0.5
    if device.type != "cuda":
        if name not in ("auto", "sdpa"):
            raise ValueError(f"attention backend {name!r} needs CUDA; on {device.type} use sdpa (or auto)")
        return SdpaAttention(causal, scale)
    if name == "sdpa":
        return SdpaAttention(causal, scale)
    if name in ("auto", "flashinfer"):
        from petal.engine.layers import flashinfer_attention

        reason = flashinfer_attention.unsupported_reason(head_dim, dtype)
        if reason is None:
            return flashinfer_attention.FlashInferAttention(
                causal=causal, scale=scale, device=device, dtype=dtype, num_heads=num_heads,
                num_kv_heads=num_kv_heads, head_dim=head_dim, max_tokens=max_tokens, max_seqs=max_seqs,
                cuda_graphs=cuda_graphs,
            )
        if name == "flashinfer":
            raise ValueError(f"--attention flashinfer is not available: {reason}")
    if dtype == torch.float32:
        # NOTE: FlashAttention kernels take fp16/bf16 only; fp32 on CUDA falls back to SDPA per sequence.
        if name == "torch":
            raise ValueError("--attention torch needs --dtype bfloat16 or float16")
        return SdpaAttention(causal, scale)
    return TorchVarlenAttention(causal, scale)
