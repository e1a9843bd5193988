"""BERT-family encoders (BertModel: MiniLM, BGE, E5, GTE, ...) over packed tokens.

Module names follow Hugging Face's ``BertModel`` so checkpoints load by name; the one change is
the fused ``attention.self.qkv`` projection (``query``/``key``/``value`` concatenated at load).
``config.json`` is read without torch by ``families.bert_config`` (the ``BERT`` family).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from petal.engine.config import ModelConfig
from petal.engine.context import ForwardContext
from petal.engine.layers.activation import get_activation
from petal.engine.layers.attention import attention
from petal.engine.layers.embedding import Embedding
from petal.engine.layers.linear import Linear, linear_gelu, linear_into_
from petal.engine.layers.norm import LayerNorm
from petal.engine.layers.small_attention import small_attention
from petal.engine.models.base import EncoderModel
from petal.engine.models.families import BERT, Family


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.word_embeddings = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = Embedding(max(cfg.type_vocab_size, 1), cfg.hidden_size)
        self.LayerNorm = LayerNorm(cfg.hidden_size, cfg.norm_eps)
        self.position_offset = cfg.position_offset

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # every token is segment 0 (single-text inputs): add token type row 0 as a bias
        h = self.word_embeddings(input_ids) + self.token_type_embeddings.weight[0]
        h = h + self.position_embeddings(self.position_ids(input_ids, positions))
        out: torch.Tensor = self.LayerNorm(h)  # [num_tokens, hidden]
        return out

    def position_ids(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The row of ``position_embeddings`` of each token (BERT: its position in its sequence)."""
        return positions if self.position_offset == 0 else positions + self.position_offset


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.head_dim = cfg.head_dim
        self.qkv = Linear(cfg.hidden_size, 3 * cfg.num_heads * cfg.head_dim)

    def forward(self, h: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        num_tokens = h.shape[0]
        qkv = self.qkv(h)  # [num_tokens, 3 * heads * head_dim]: q | k | v
        if ctx.fused_attention:  # one Triton kernel (small buckets)
            out = small_attention(qkv, ctx.token_seq_ids, ctx.cu_seqlens, num_heads=self.num_heads,
                                  num_kv_heads=self.num_heads, head_dim=self.head_dim, causal=False,
                                  scale=self.head_dim**-0.5)
            return out.view(num_tokens, self.num_heads * self.head_dim)
        q, k, v = qkv.view(num_tokens, 3, self.num_heads, self.head_dim).unbind(1)
        out = attention(q, k, v, ctx)  # [num_tokens, heads, head_dim]
        return out.reshape(num_tokens, self.num_heads * self.head_dim)


class BertSelfOutput(nn.Module):
    def __init__(self, cfg: ModelConfig, in_features: int) -> None:
        super().__init__()
        self.dense = Linear(in_features, cfg.hidden_size)
        self.LayerNorm = LayerNorm(cfg.hidden_size, cfg.norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        if ctx.gemm_epilogues and self.dense.bias is not None:
            # NOTE: in place: the GEMM adds x W^T into the residual stream's buffer (the layer's input or its
            # attention output, read by every earlier kernel of the layer and by nothing later), so the
            # LayerNorm reads one tensor and the bias row instead of two tensors.
            out: torch.Tensor = self.LayerNorm(linear_into_(x, self.dense, residual), self.dense.bias)
            return out
        out = self.LayerNorm(self.dense(x), residual)
        return out


class BertAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg, cfg.num_heads * cfg.head_dim)

    def forward(self, h: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        out: torch.Tensor = self.output(self.self(h, ctx), h, ctx)
        return out


class BertIntermediate(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = get_activation(cfg.hidden_act)

    def forward(self, h: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        if ctx.gelu_epilogue and self.dense.bias is not None:  # bias + GELU in the GEMM (engine/small_batch.py)
            return linear_gelu(h, self.dense)
        return self.act(self.dense(h))


class BertLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertSelfOutput(cfg, cfg.intermediate_size)

    def forward(self, h: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        h = self.attention(h, ctx)
        out: torch.Tensor = self.output(self.intermediate(h, ctx), h, ctx)
        return out


class BertEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))


class BertModel(EncoderModel):
    """Packed BERT encoder: ``forward(input_ids [T], positions [T], ctx) -> [T, hidden]``."""

    family: ClassVar[Family] = BERT  # bert_config; bidirectional; mean pooling for a bare directory
    # Checkpoints saved from task heads prefix the trunk with one of these.
    weight_prefixes: tuple[str, ...] = ("", "bert.", "model.")
    fused_weights = ((".qkv.", (".query.", ".key.", ".value.")),)

    embeddings_class: ClassVar[type[BertEmbeddings]] = BertEmbeddings

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = self.embeddings_class(cfg)
        self.encoder = BertEncoder(cfg)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        h = self.embeddings(input_ids, positions)
        for layer in self.encoder.layer:
            h = layer(h, ctx)
        out: torch.Tensor = h
        return out
