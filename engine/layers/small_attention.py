"""Attention of small buckets (a lone query, a few short texts) in one Triton kernel a layer.

At a few dozen tokens FlashInfer's prefill kernel costs ~8 us a layer on the H200 and needs a
host-side ``plan()`` whenever the lengths change; the work itself is a few kFLOP. This kernel reads
the fused QKV projection as it is, applies Qwen3's per-head RMSNorm and NeoX RoPE to q and k in
registers (``norm_rope``), and attends each query to the keys of its own sequence (``token_seq_ids``;
causal by token index when the model is causal), with an online softmax over key blocks. No plan,
no workspace: it is capturable as is, and the whole step's attention metadata is already on the
device (``cu_seqlens``, ``token_seq_ids``).

Each program takes one query head and ``BLOCK_M`` query rows, and visits only the keys from the
start of its first row's sequence to the end of its last row's, so the cost stays linear in the
bucket for batches of short sequences. A step of at most ``WHOLE_MAX_TOKENS`` token slots (buckets up to 128
tokens) takes every slot as one key block instead: all its loads are issued at once, without first
looking up where its sequences start and end (two dependent loads before the first key's). Every
program normalises and rotates the key blocks it reads itself, so a long sequence costs more here
than in FlashInfer (1 x 200 tokens: 21 against 13 us a layer): ``engine/small_batch.py`` uses it for
buckets of up to 128 tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

SMALL_ATTENTION_HEAD_DIMS = (32, 64, 128, 256)
WHOLE_MAX_TOKENS = 128  # the most token slots a step may have to take them all as one key block
LOG2_E = 1.4426950408889634  # the kernels' softmax is in base 2


@dataclass(frozen=True)
class SmallAttention:
    """A layer's attention inputs besides the fused projection (see ``small_attention``'s parameters)."""

    token_seq_ids: torch.Tensor  # [num_tokens] int32
    cu_seqlens: torch.Tensor  # [num_seqs + 1] int32
    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool
    scale: float
    positions: torch.Tensor | None = None  # [num_tokens] int32 (Qwen3's RoPE)
    rope_table: torch.Tensor | None = None  # [max_positions, head_dim] float32 cos|sin
    qk_norm_weights: torch.Tensor | None = None  # [2, head_dim] (Qwen3's q/k RMSNorm)
    eps: float = 0.0

    def __post_init__(self) -> None:
        assert self.head_dim in SMALL_ATTENTION_HEAD_DIMS and self.num_heads % self.num_kv_heads == 0
        if self.qk_norm_weights is not None:
            assert self.positions is not None and self.rope_table is not None

    def kernel_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``positions, rope_table, qk_norm_weights`` as the kernels take them.
        NOTE: without q/k norm and RoPE these are unused pointers (the kernels are specialised on
        NORM_ROPE=False and never read them)."""
        if self.qk_norm_weights is None:
            return self.token_seq_ids, self.token_seq_ids, self.token_seq_ids
        assert self.positions is not None and self.rope_table is not None
        return self.positions, self.rope_table, self.qk_norm_weights


@functools.cache
def _kernel():  # type: ignore[no-untyped-def]  # Triton kernels are untyped
    from petal.engine.layers.triton_attention import small_attention_kernel

    return small_attention_kernel


def small_attention(qkv: torch.Tensor, token_seq_ids: torch.Tensor, cu_seqlens: torch.Tensor, *, num_heads: int,
                    num_kv_heads: int, head_dim: int, causal: bool, scale: float, positions: torch.Tensor | None = None,
                    rope_table: torch.Tensor | None = None, qk_norm_weights: torch.Tensor | None = None,
                    eps: float = 0.0, block_m: int | None = None, block_n: int | None = None, pdl: bool = False,
                    whole: bool | None = None) -> torch.Tensor:
    """Self-attention of every packed sequence over a fused projection, in one kernel.

    Parameters
    ----------
    qkv : ``[num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]`` bf16/fp16, CUDA, unit last stride:
        q heads, then k heads, then v heads (Qwen3's ``qkv_proj``; BERT's ``[T, 3, H, D]`` is the same).
    token_seq_ids, cu_seqlens : the step's ``[num_tokens]`` sequence of each token and ``[num_seqs + 1]``
        offsets (int32, device; ``ForwardContext``'s): a token attends to the keys of its own sequence.
    positions, rope_table, qk_norm_weights, eps : Qwen3's q/k RMSNorm (``[2, head_dim]`` weights) and
        RoPE (``positions [num_tokens]`` int32, ``rope_table [max_positions, head_dim]`` float32 cos|sin);
        all ``None`` for models without them.
    pdl : launch as a programmatic dependent launch (sm90+; ``engine/layers/skinny_linear.py``).
    whole : every token slot as one key block (the default for steps of up to ``WHOLE_MAX_TOKENS`` slots, or of
        up to an explicit ``block_n``): every load is issued at once, with no sequence offsets to look up first;
        ``False`` keeps the blocked loop.

    Returns ``[num_tokens, num_heads, head_dim]`` in ``qkv``'s dtype. ``qkv`` is left as it was.
    """
    attention = SmallAttention(token_seq_ids, cu_seqlens, num_heads, num_kv_heads, head_dim, causal, scale,
                               positions, rope_table, qk_norm_weights, eps)
    return attend(qkv, attention, block_m=block_m, block_n=block_n, pdl=pdl, whole=whole)


def attend(qkv: torch.Tensor, attention: SmallAttention, *, block_m: int | None = None, block_n: int | None = None,
           pdl: bool = False, whole: bool | None = None, num_warps: int | None = None) -> torch.Tensor:
    """``small_attention`` with its inputs besides ``qkv`` in one ``SmallAttention``. Tiles left ``None`` are
    the measured ones (``bench/attention_o_probe.py whole``): 32 query rows and 64 keys a block, 4 warps; a step of
    65-128 slots as one key block takes 16 query rows and 8 warps (5 against 8.7 us a layer blocked)."""
    a = attention
    num_tokens = qkv.shape[0]
    assert qkv.stride(-1) == 1
    out = torch.empty(num_tokens, a.num_heads, a.head_dim, dtype=qkv.dtype, device=qkv.device)
    if num_tokens == 0:
        return out
    positions, rope_table, qk_norm_weights = a.kernel_inputs()
    if whole is None:
        whole = num_tokens <= (block_n or WHOLE_MAX_TOKENS)
    wide = whole and num_tokens > 64
    block_n = block_n or (1 << (num_tokens - 1).bit_length() if wide else 64)
    block_m = block_m or (16 if wide else 32)
    num_warps = num_warps or (8 if wide else 4)
    assert not whole or num_tokens <= block_n, (num_tokens, block_n)
    grid = (a.num_heads, -(-num_tokens // block_m))
    _kernel()[grid](qkv, qkv.stride(0), out, out.stride(0), a.token_seq_ids, a.cu_seqlens, positions,
                    rope_table, qk_norm_weights, a.eps, a.scale * LOG2_E, num_tokens,
                    Q_HEADS=a.num_heads, K_HEADS=a.num_kv_heads, HALF=a.head_dim // 2, BLOCK_M=block_m,
                    BLOCK_N=block_n, CAUSAL=a.causal, NORM_ROPE=a.qk_norm_weights is not None, PDL=pdl,
                    WHOLE=whole, num_warps=num_warps, launch_pdl=pdl)
    return out
