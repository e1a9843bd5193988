"""Activations by their Hugging Face ``hidden_act`` names."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from petal.engine.layers.kernels import fused

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,  # exact (erf) GELU, as BERT
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"activation {name!r} is not supported; known: {', '.join(sorted(_ACTIVATIONS))}") from None


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused ``[gate | up]`` projection: ``silu(gate) * up`` (one FlashInfer kernel on CUDA)."""
    fi = fused(gate_up)
    if fi is not None:
        out: torch.Tensor = fi.silu_and_mul(gate_up)
        return out
    gate, up = gate_up.chunk(2, dim=-1)  # [num_tokens, 2 * inter] -> 2 x [num_tokens, inter]
    return F.silu(gate) * up
