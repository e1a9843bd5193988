"""Qwen3 encoders (pplx-embed-v1: bidirectional + mean; Qwen3-Embedding: causal + last token).

Module names follow Hugging Face's ``Qwen3Model``; the changes are fused projections
(``self_attn.qkv_proj`` = q|k|v, ``mlp.gate_up_proj`` = gate|up), concatenated at load.
``config.json`` is read without torch by ``families.qwen3_config`` (the ``QWEN3`` family).
"""

from __future__ import annotations

from typing import ClassVar, cast

import torch
from torch import nn

from petal.engine.config import ModelConfig
from petal.engine.context import ForwardContext
from petal.engine.layers.activation import silu_and_mul
from petal.engine.layers.attention import attention
from petal.engine.layers.embedding import Embedding
from petal.engine.layers.fused_mlp import gate_up_silu
from petal.engine.layers.linear import Linear, linear_into_
from petal.engine.layers.norm import RMSNorm
from petal.engine.layers.rotary import RopeTables, RotaryEmbedding, apply_rotary
from petal.engine.layers.skinny_linear import (
    LayerSizes,
    NormInput,
    SkinnyLayerWeights,
    SkinnyOptions,
    layer_tiles,
    norm_input,
    skinny_layer,
)
from petal.engine.layers.small_attention import SmallAttention, small_attention
from petal.engine.layers.tma_mlp import gate_up_silu_tma
from petal.engine.layers.triton_kernels import qk_norm_rope_, triton_available
from petal.engine.models.base import EncoderModel
from petal.engine.models.families import QWEN3, Family


class Qwen3Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        bias = dict(cfg.extra).get("attention_bias", False)
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.causal = cfg.causal
        self.q_size, self.kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=bool(bias))
        self.o_proj = Linear(self.q_size, cfg.hidden_size, bias=bool(bias))
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self._qk_weights: torch.Tensor | None = None

    def qk_weights(self) -> torch.Tensor:
        """``[2, D]``: q_norm and k_norm weights stacked for the fused kernel (built on first use)."""
        if self._qk_weights is None:
            self._qk_weights = torch.stack([self.q_norm.weight, self.k_norm.weight]).contiguous()
        return self._qk_weights

    def forward(self, h: torch.Tensor, rope: RopeTables, ctx: ForwardContext,
                residual: torch.Tensor | None = None) -> torch.Tensor:
        """``[T, hidden] -> [T, hidden]``; with ``residual`` (no o_proj bias), the O GEMM adds its product into
        ``residual`` in place and returns it."""
        num_tokens = h.shape[0]
        qkv = self.qkv_proj(h)  # [T, (Hq + 2 Hk) * D]
        if ctx.fused_attention:  # q/k norm, RoPE and attention in one kernel (small buckets)
            fused = small_attention(qkv, ctx.token_seq_ids, ctx.cu_seqlens, num_heads=self.num_heads,
                                    num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, causal=self.causal,
                                    scale=self.head_dim**-0.5, positions=rope.positions, rope_table=rope.table,
                                    qk_norm_weights=self.qk_weights(), eps=self.q_norm.eps)
            return self._project(fused.view(num_tokens, self.q_size), residual)
        if qkv.is_cuda and triton_available():
            qk_norm_rope_(qkv, rope.positions, rope.table, self.qk_weights(), self.q_norm.eps, self.num_heads,
                          self.num_kv_heads, self.head_dim)
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = q.view(num_tokens, self.num_heads, self.head_dim)  # strided views, no copies
            k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        else:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = self.q_norm(q.reshape(num_tokens, self.num_heads, self.head_dim))  # [T, Hq, D]
            k = self.k_norm(k.reshape(num_tokens, self.num_kv_heads, self.head_dim))  # [T, Hk, D]
            q, k = apply_rotary(q, k, *rope.cos_sin(q.dtype))
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        out = attention(q, k, v, ctx)  # [T, Hq, D]
        return self._project(out.reshape(num_tokens, self.q_size), residual)

    def _project(self, out: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        if residual is not None:
            return linear_into_(out, self.o_proj, residual)
        projected: torch.Tensor = self.o_proj(out)
        return projected


class Qwen3MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ValueError(f"Qwen3 hidden_act {cfg.hidden_act!r} is not supported (only silu)")
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, ctx: ForwardContext, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``[T, hidden] -> [T, hidden]``; with ``residual``, the down GEMM adds into it in place and returns it."""
        if ctx.fused_mlp:  # gate/up GEMM with SwiGLU in its epilogue (small buckets)
            act = gate_up_silu(h, self.gate_up_proj.weight)
        elif ctx.tma_mlp:  # the same, as a TMA kernel (large buckets, sm90+)
            act = gate_up_silu_tma(h, self.gate_up_proj.weight)
        else:
            act = silu_and_mul(self.gate_up_proj(h))
        if residual is not None:
            return linear_into_(act, self.down_proj, residual)
        out: torch.Tensor = self.down_proj(act)
        return out


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(cfg)
        self.mlp = Qwen3MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_eps)

    def forward(self, h: torch.Tensor, residual: torch.Tensor | None, rope: RopeTables,
                ctx: ForwardContext) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = h
            h = self.input_layernorm(h)
        else:
            h, residual = self.input_layernorm(h, residual)
        h = self.self_attn(h, rope, ctx)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h, ctx), residual

    def forward_into(self, h: torch.Tensor, rope: RopeTables, ctx: ForwardContext) -> None:
        """The layer on the residual stream ``h [T, hidden]``, in place: the O and down GEMMs add their
        products into ``h`` (cuBLAS beta 1), so each norm reads one tensor instead of reading two and
        writing two as the fused add + RMSNorm does (``ctx.gemm_epilogues``)."""
        self.self_attn(self.input_layernorm(h), rope, ctx, residual=h)
        self.mlp(self.post_attention_layernorm(h), ctx, residual=h)

    def skinny_weights(self) -> SkinnyLayerWeights:
        """This layer's weights as ``skinny_layer`` reads them."""
        attn, mlp = self.self_attn, self.mlp
        return SkinnyLayerWeights(self.input_layernorm.weight, attn.qkv_proj.weight, attn.o_proj.weight,
                                  self.post_attention_layernorm.weight, mlp.gate_up_proj.weight, mlp.down_proj.weight,
                                  attn.qk_weights(), self.input_layernorm.eps)


class Qwen3Model(EncoderModel):
    """Packed Qwen3 trunk: ``forward(input_ids [T], positions [T], ctx) -> [T, hidden]`` (final norm applied)."""

    family: ClassVar[Family] = QWEN3  # qwen3_config; causal or bidirectional; no default pooling
    weight_prefixes: tuple[str, ...] = ("", "model.")
    fused_weights = ((".qkv_proj.", (".q_proj.", ".k_proj.", ".v_proj.")),
                     (".gate_up_proj.", (".gate_proj.", ".up_proj.")))

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        rope = self.rotary.tables(positions)
        if ctx.skinny_layers:  # small buckets: h is the residual stream, updated in place layer by layer
            weights = [block.skinny_weights() for block in cast(list[Qwen3DecoderLayer], list(self.layers))]
            first = cast(Qwen3DecoderLayer, self.layers[0]).self_attn
            attention = SmallAttention(ctx.token_seq_ids, ctx.cu_seqlens, first.num_heads, first.num_kv_heads,
                                       first.head_dim, first.causal, first.head_dim**-0.5, rope.positions, rope.table,
                                       weights[0].qk_norm, first.q_norm.eps)  # NOTE: each layer its own q/k norm
            options = SkinnyOptions(ctx.pdl, ctx.attention_in_o)
            x: NormInput | None = norm_input(h, weights[0].input_norm)
            tiles = layer_tiles(h.shape[0], LayerSizes(weights[0].qkv.shape[1], weights[0].o.shape[1],
                                                       weights[0].down.shape[1]))
            for i, weight in enumerate(weights):
                assert x is not None
                x = skinny_layer(h, x, weight, weights[i + 1] if i + 1 < len(weights) else None,
                                 attention, tiles, options)
            skinny_out: torch.Tensor = self.norm(h)
            return skinny_out
        if ctx.gemm_epilogues:  # h is the residual stream, the GEMMs add into it in place
            for block in cast(list[Qwen3DecoderLayer], list(self.layers)):
                block.forward_into(h, rope, ctx)
            into_out: torch.Tensor = self.norm(h)
            return into_out
        residual: torch.Tensor | None = None
        for layer in self.layers:
            h, residual = layer(h, residual, rope, ctx)
        h, _ = self.norm(h, residual)
        out: torch.Tensor = h
        return out
