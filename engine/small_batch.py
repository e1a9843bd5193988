"""Which kernels a small step runs: the latency path (a lone query, a few short texts).

A step of a few dozen tokens does little arithmetic and is decided by kernel count and weight
reads. For buckets up to a per-kernel limit (``EngineConfig``'s ``*_tokens`` fields, measured on
the H200: README "Small-batch latency") a step runs

- attention as one Triton kernel with Qwen3's q/k norm and RoPE inside (no FlashInfer ``plan()``),
- Qwen3's gate/up GEMM with SwiGLU in its epilogue.

The choice is made per bucket (a graph's shapes are fixed), so each bucket's graph holds one path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from petal.engine.config import EngineConfig, ModelConfig
from petal.engine.context import ForwardContext
from petal.engine.layers.fused_mlp import fits as fused_mlp_fits
from petal.engine.layers.small_attention import SMALL_ATTENTION_HEAD_DIMS
from petal.engine.layers.triton_kernels import triton_available


@dataclass(frozen=True)
class SmallBatchKernels:
    attention_tokens: int  # buckets up to this many tokens run the fused attention kernel (0: none)
    mlp_tokens: int  # ... the fused gate/up + SwiGLU kernel (Qwen3)

    @classmethod
    def for_engine(cls, config: EngineConfig, model: ModelConfig, device: torch.device,
                   dtype: torch.dtype) -> SmallBatchKernels:
        """What this engine may use: CUDA, Triton, a 16-bit activation dtype, a supported head dim."""
        if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16) or not triton_available():
            return cls(0, 0)
        # NOTE: an explicit --attention backend is what runs; the fused kernel stands in for ``auto`` only.
        fits = model.head_dim in SMALL_ATTENTION_HEAD_DIMS and config.attention == "auto"
        attention = config.small_attention_tokens if fits else 0
        qwen3 = model.architecture == "qwen3"
        mlp = config.fused_mlp_tokens if qwen3 and fused_mlp_fits(model.hidden_size, model.intermediate_size) else 0
        return cls(attention, mlp)

    def apply(self, ctx: ForwardContext, num_tokens: int) -> None:
        """Mark ``ctx`` (a step of ``num_tokens`` token slots) with the kernels its bucket runs."""
        ctx.fused_attention = num_tokens <= self.attention_tokens
        ctx.fused_mlp = num_tokens <= self.mlp_tokens
