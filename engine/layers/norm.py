"""Normalisation layers (LayerNorm for BERT-like models, RMSNorm for Qwen3-like models)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from petal.engine.layers.kernels import fused
from petal.engine.layers.triton_kernels import add_layer_norm, triton_available


class LayerNorm(nn.Module):
    """LayerNorm over the last dim; weight/bias keep Hugging Face names (``weight``, ``bias``)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``LayerNorm(x)``, or ``LayerNorm(x + residual)`` (one fused kernel on CUDA). ``x [T, hidden]``;
        ``residual`` ``[T, hidden]`` or one ``[hidden]`` row added to every row (a bias)."""
        if residual is not None:
            if x.is_cuda and x.dtype != torch.float32 and triton_available() and x.is_contiguous() \
                    and residual.is_contiguous():
                return add_layer_norm(x, residual, self.weight, self.bias, self.eps)
            x = x + residual
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm over the last dim, in fp32, cast back (as Hugging Face Qwen3 does).

    ``forward(x, residual)`` fuses the residual add: returns ``(norm(x + residual), x + residual)``
    (FlashInfer's ``fused_add_rmsnorm`` in place on CUDA).
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def forward(self, x: torch.Tensor,
                residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        fi = fused(x)
        if residual is None:
            if fi is not None:
                normed: torch.Tensor = fi.rmsnorm(x.contiguous(), self.weight, self.eps)
                return normed
            return self._norm(x)
        if fi is not None:
            # NOTE: in place: residual <- x + residual, x <- rmsnorm(residual)
            fi.fused_add_rmsnorm(x, residual, self.weight, self.eps)
            return x, residual
        residual = x + residual
        return self._norm(residual), residual
