"""Linear layers whose weights may be stored in a narrower dtype than the activations.

On CPUs with AMX (bf16 matrix units) a bf16 weight with fp32 activations runs the GEMM in bf16
with fp32 accumulation while norms, softmax, GELU and the residual stream stay fp32: about twice
the fp32 speed at cosine >= 0.9999 to the fp32 model (see README, CPU benchmark).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Linear):
    """``nn.Linear`` (Hugging Face names ``weight``/``bias``); if ``weight`` is narrower than the
    input, the input is cast for the GEMM and the output cast back before the bias is added.

    No random init (``reset_parameters`` does nothing): every weight comes from a checkpoint, and
    ``kaiming_uniform_`` on 0.6B parameters is seconds of work thrown away (see ``Embedding``).
    """

    def reset_parameters(self) -> None:
        """No init: weights are created empty and filled by ``load_state_dict(assign=True)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype == x.dtype:
            return F.linear(x, self.weight, self.bias)
        out = F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)
        return out if self.bias is None else out + self.bias


def linear_gelu(x: torch.Tensor, linear: Linear) -> torch.Tensor:
    """``gelu(x @ W^T + b)`` as one cuBLASLt GEMM, bias and GELU in its epilogue: ``[T, in] -> [T, out]``.

    NOTE: cuBLASLt's GELU is the tanh approximation (``F.gelu(..., approximate="tanh")``); it is applied to
    the fp32 accumulator, before the one rounding to ``x``'s dtype. CUDA only (the CPU kernel applies
    the erf GELU), ``x``, weight and bias of one dtype.
    """
    assert linear.bias is not None and linear.weight.dtype == x.dtype
    out: torch.Tensor = torch._addmm_activation(linear.bias, x, linear.weight.t(), use_gelu=True)
    return out


def linear_into_(x: torch.Tensor, linear: Linear, residual: torch.Tensor) -> torch.Tensor:
    """``residual += x @ W^T`` in the GEMM itself (cuBLAS with beta 1; no bias): ``[T, in]``, ``[T, out]``.

    NOTE: in place: returns ``residual``, whose old values are gone.
    """
    assert linear.weight.dtype == x.dtype == residual.dtype
    out: torch.Tensor = residual.addmm_(x, linear.weight.t())
    return out


def narrow_linear_weights(model: nn.Module, dtype: torch.dtype) -> None:
    """Store every ``Linear`` weight of ``model`` in ``dtype`` (biases keep the activation dtype)."""
    for module in model.modules():
        if isinstance(module, Linear) and module.weight.dtype != dtype:
            module.weight = nn.Parameter(module.weight.detach().to(dtype), requires_grad=False)
