"""sentence-transformers ``Dense`` layers after pooling (weight names ``linear.weight`` / ``linear.bias``)."""

from __future__ import annotations

import torch
from torch import nn

from petal.engine.config import DenseConfig
from petal.engine.layers.linear import Linear

_ACTIVATIONS: dict[str, nn.Module] = {
    "identity": nn.Identity(),
    "tanh": nn.Tanh(),
    "relu": nn.ReLU(),
    "gelu": nn.GELU(),
    "sigmoid": nn.Sigmoid(),
    "silu": nn.SiLU(),
}


class Dense(nn.Module):
    """``activation(linear(x))``: ``[num_seqs, in_features]`` -> ``[num_seqs, out_features]``."""

    def __init__(self, cfg: DenseConfig) -> None:
        super().__init__()
        self.linear = Linear(cfg.in_features, cfg.out_features, bias=cfg.bias)
        self.activation = _ACTIVATIONS[cfg.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.activation(self.linear(x))
        return out
