"""Which kernels a small step runs: the latency path (a lone query, a few short texts).

A step of a few dozen tokens does little arithmetic and is decided by kernel count and weight
reads. For buckets up to a per-kernel limit (``EngineConfig``'s ``*_tokens`` fields, measured on
the H200: README "Small-batch latency") a step runs

- attention as one Triton kernel with Qwen3's q/k norm and RoPE inside (no FlashInfer ``plan()``),
- Qwen3's gate/up GEMM with SwiGLU in its epilogue,
- (buckets up to 128 tokens) each Qwen3 layer as four weight-streaming GEMMs with the norms and residual
  adds inside, around that attention kernel, launched as programmatic dependent launches on sm90+, with
  tiles per bucket (``engine/layers/skinny_linear.py``); in the 16-token bucket the attention runs inside
  the O projection's kernel.

The choice is made per bucket (a graph's shapes are fixed), so each bucket's graph holds one path.

Every bucket on CUDA (``EngineConfig.gemm_epilogues``) also moves work into the GEMMs:
- the attention output and down projections add their products into the residual stream in the GEMM
  (cuBLAS beta 1), so the norm after them reads one tensor: BERT's LayerNorm reads it and the bias row;
  Qwen3's RMSNorm reads it instead of the fused add + RMSNorm's two reads and two writes (a Qwen3 with
  attention biases keeps the fused add);
- a BERT-family up projection applies its bias and GELU in cuBLASLt's epilogue. That GELU is the tanh
  approximation: taken for the tanh GELUs, and for the erf GELU (BERT, XLM-R) in bfloat16 only, where the
  two differ (mean 1.5e-4, at most 4.7e-4) by a seventh of bfloat16's own rounding error (mean 1.1e-3); in
  float16 (rounding error 1.4e-4) the erf GELU stays a kernel of its own.

Qwen3 buckets of at least ``EngineConfig.tma_mlp_tokens`` tokens (sm90+) run the gate/up GEMM with SwiGLU in
its epilogue as a persistent TMA kernel (``engine/layers/tma_mlp.py``) instead of cuBLAS + ``silu_and_mul``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from petal.engine.config import EngineConfig, ModelConfig
from petal.engine.context import ForwardContext
from petal.engine.layers.fused_mlp import fits as fused_mlp_fits
from petal.engine.layers.skinny_linear import BUCKET_TILES, SkinnyOptions, attention_fits, layer_tiles
from petal.engine.layers.skinny_linear import MAX_ROWS as SKINNY_MAX_ROWS
from petal.engine.layers.skinny_linear import fits as skinny_fits
from petal.engine.layers.small_attention import SMALL_ATTENTION_HEAD_DIMS
from petal.engine.layers.tma_mlp import fits as tma_mlp_fits
from petal.engine.layers.tma_mlp import tma_available
from petal.engine.layers.triton_kernels import triton_available
from petal.engine.models.families import BERT_LAYOUT

TANH_GELUS = frozenset({"gelu_new", "gelu_pytorch_tanh", "gelu_fast"})  # hidden_act names of the tanh GELU


@dataclass(frozen=True)
class SmallBatchKernels:
    attention_tokens: int  # buckets up to this many tokens run the fused attention kernel (0: none)
    mlp_tokens: int  # ... the fused gate/up + SwiGLU kernel (Qwen3)
    skinny_tokens: int = 0  # ... whole Qwen3 layers as weight-streaming kernels
    pdl: bool = False  # ... launched as programmatic dependent launches
    attention_in_o: bool = False  # ... the attention inside the O projection (buckets whose tiles have it)
    gemm_epilogues: bool = False  # every bucket: residual adds in the GEMMs (BERT family, Qwen3 without biases)
    gelu_epilogue: bool = False  # every bucket: the up projection's bias + GELU in cuBLASLt's epilogue
    tma_mlp_tokens: int = 0  # buckets of at least this many tokens: Qwen3's gate/up + SwiGLU as a TMA kernel (0: none)

    @classmethod
    def for_engine(cls, config: EngineConfig, model: ModelConfig, device: torch.device,
                   dtype: torch.dtype) -> SmallBatchKernels:
        """What this engine may use: CUDA, Triton, a 16-bit activation dtype, a supported head dim."""
        if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
            return cls(0, 0)
        bert = model.architecture in BERT_LAYOUT
        gelu = config.gemm_epilogues and bert and (
            model.hidden_act in TANH_GELUS or (model.hidden_act == "gelu" and dtype == torch.bfloat16))
        qwen3_plain = model.architecture == "qwen3" and not dict(model.extra).get("attention_bias", False)
        into = config.gemm_epilogues and (bert or qwen3_plain)
        if not triton_available():
            return cls(0, 0, gemm_epilogues=into, gelu_epilogue=gelu)
        # NOTE: an explicit --attention backend is what runs; the fused kernel stands in for ``auto`` only.
        fits = model.head_dim in SMALL_ATTENTION_HEAD_DIMS and config.attention == "auto"
        attention = config.small_attention_tokens if fits else 0
        qwen3 = model.architecture == "qwen3"
        mlp = config.fused_mlp_tokens if qwen3 and fused_mlp_fits(model.hidden_size, model.intermediate_size) else 0
        tma = config.tma_mlp_tokens if qwen3 and tma_mlp_fits(model.hidden_size, model.intermediate_size) and \
            tma_available(device.index if device.index is not None else torch.cuda.current_device()) else 0
        skinny = 0
        if fits and qwen3 and not dict(model.extra).get("attention_bias", False) and skinny_fits(
                model.hidden_size, model.num_heads * model.head_dim, model.intermediate_size):
            skinny = min(config.skinny_layer_tokens, SKINNY_MAX_ROWS)
        pdl = config.pdl and skinny > 0 and torch.cuda.get_device_capability(device)[0] >= 9
        in_o = config.attention_in_o and skinny > 0 and all(
            attention_fits(model.hidden_size, t.attention_o)
            for t in BUCKET_TILES.values() if t.attention_o is not None)
        return cls(attention, mlp, skinny, pdl, in_o, gemm_epilogues=into, gelu_epilogue=gelu, tma_mlp_tokens=tma)

    def skinny_options(self) -> SkinnyOptions:
        """How the skinny layers launch (the warm-up compiles these variants)."""
        return SkinnyOptions(self.pdl, self.attention_in_o)

    def apply(self, ctx: ForwardContext, num_tokens: int) -> None:
        """Mark ``ctx`` (a step of ``num_tokens`` token slots) with the kernels its bucket runs."""
        ctx.fused_attention = num_tokens <= self.attention_tokens
        ctx.fused_mlp = num_tokens <= self.mlp_tokens
        ctx.tma_mlp = not ctx.fused_mlp and 0 < self.tma_mlp_tokens <= num_tokens
        ctx.skinny_layers = num_tokens <= self.skinny_tokens
        ctx.pdl = self.pdl and ctx.skinny_layers
        ctx.attention_in_o = (self.attention_in_o and ctx.skinny_layers
                              and layer_tiles(num_tokens).attention_o is not None)
        ctx.gemm_epilogues = self.gemm_epilogues
        ctx.gelu_epilogue = self.gelu_epilogue
