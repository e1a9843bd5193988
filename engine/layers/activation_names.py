"""The Hugging Face ``hidden_act`` names petal runs, without torch: ``engine/models/families.py`` judges a
model's ``config.json`` by them before torch loads, and ``activation.py`` checks its table against them."""

from __future__ import annotations

HIDDEN_ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu",
                                       "swish")


def check_activation(name: str) -> str:
    """``name`` if petal runs that activation, else a ``ValueError`` listing those it runs."""
    if name not in HIDDEN_ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not supported; known: {', '.join(sorted(HIDDEN_ACTIVATIONS))}")
    return name
