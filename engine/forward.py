"""The model's forward pass to pooled vectors, shared by the eager path and the CUDA graph runner."""

from __future__ import annotations

import torch
from torch import nn

from petal.engine.config import PoolingConfig
from petal.engine.context import ForwardContext
from petal.engine.layers.pooling import l2_normalize, pool


def forward_pooled(
    model: nn.Module, pooling: PoolingConfig, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
) -> torch.Tensor:
    """Model, pooling, Dense layers and normalisation: ``[num_tokens]`` ids -> ``[ctx.num_seqs, dim]`` float32."""
    hidden = model(input_ids, positions, ctx)
    pooled = pool(hidden, ctx, pooling.mode)
    # NOTE: nn.Module attribute lookup: ``dense_head`` exists only when load_model found Dense layers.
    dense_head = getattr(model, "dense_head", None)
    if dense_head is not None:
        pooled = dense_head(pooled)
    return l2_normalize(pooled) if pooling.normalize else pooled
