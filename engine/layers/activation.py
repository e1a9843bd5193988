"""Activations by their Hugging Face ``hidden_act`` names."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from petal.engine.layers.activation_names import HIDDEN_ACTIVATIONS, check_activation
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
assert set(_ACTIVATIONS) == set(HIDDEN_ACTIVATIONS)  # the torch-free names config.json is judged by


def get_activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return _ACTIVATIONS[check_activation(name)]


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused ``[gate | up]`` projection: ``silu(gate) * up`` (one FlashInfer kernel on CUDA)."""
    fi = fused(gate_up)
    if fi is not None:
        out: torch.Tensor = fi.silu_and_mul(gate_up)
        return out
    gate, up = gate_up.chunk(2, dim=-1)  # [num_tokens, 2 * inter] -> 2 x [num_tokens, inter]
    return F.silu(gate) * up
