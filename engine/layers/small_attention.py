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
bucket for batches of short sequences. A step of at most ``block_n`` token slots (buckets up to 64
tokens) takes every slot as one key block instead: all its loads are issued at once, without first
looking up where its sequences start and end (two dependent loads before the first key's). Every
program normalises and rotates the key blocks it reads itself, so a long sequence costs more here
than in FlashInfer (1 x 200 tokens: 21 against 13 us a layer): ``engine/small_batch.py`` uses it for
buckets of up to 128 tokens.
"""

from __future__ import annotations

import functools

import torch

SMALL_ATTENTION_HEAD_DIMS = (32, 64, 128, 256)
WHOLE_MAX_TOKENS = 64  # the most token slots a step may have to take them all as one key block (and block_n)


@functools.cache
def _kernel():  # type: ignore[no-untyped-def]  # Triton kernels are untyped
    from petal.engine.layers.triton_attention import small_attention_kernel

    return small_attention_kernel


def small_attention(qkv: torch.Tensor, token_seq_ids: torch.Tensor, cu_seqlens: torch.Tensor, *, num_heads: int,
                    num_kv_heads: int, head_dim: int, causal: bool, scale: float, positions: torch.Tensor | None = None,
                    rope_table: torch.Tensor | None = None, qk_norm_weights: torch.Tensor | None = None,
                    eps: float = 0.0, block_m: int = 32, block_n: int = 64, pdl: bool = False,
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
    whole : every token slot as one key block (``num_tokens <= block_n``, the default then): every load is
        issued at once, with no sequence offsets to look up first; ``False`` keeps the blocked loop.

    Returns ``[num_tokens, num_heads, head_dim]`` in ``qkv``'s dtype. ``qkv`` is left as it was.
    """
    num_tokens = qkv.shape[0]
    assert qkv.stride(-1) == 1 and head_dim in SMALL_ATTENTION_HEAD_DIMS and num_heads % num_kv_heads == 0
    out = torch.empty(num_tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if num_tokens == 0:
        return out
    norm_rope = qk_norm_weights is not None
    if norm_rope:
        assert positions is not None and rope_table is not None
    else:  # NOTE: unused pointers (the kernel is specialised on NORM_ROPE=False and never reads them)
        positions, rope_table, qk_norm_weights = token_seq_ids, qkv, qkv
    if whole is None:
        whole = num_tokens <= min(block_n, WHOLE_MAX_TOKENS)
    assert not whole or num_tokens <= block_n, (num_tokens, block_n)
    grid = (num_heads, -(-num_tokens // block_m))
    _kernel()[grid](qkv, qkv.stride(0), out, out.stride(0), token_seq_ids, cu_seqlens, positions,
                    rope_table, qk_norm_weights, eps, scale * 1.4426950408889634, num_tokens,
                    Q_HEADS=num_heads, K_HEADS=num_kv_heads, HALF=head_dim // 2, BLOCK_M=block_m,
                    BLOCK_N=block_n, CAUSAL=causal, NORM_ROPE=norm_rope, PDL=pdl, WHOLE=whole, num_warps=4,
                    launch_pdl=pdl)
    return out
