"""Building a native model with no storage and no init, then checking that loading filled it."""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def build_empty(model_cls: type[M], config: Any) -> M:
    """``model_cls(config)`` on the meta device: no memory, no random init; fill it with
    ``load_state_dict(state, assign=True)``, then ``check_loaded``."""
    with torch.device("meta"):
        return model_cls(config)


def check_loaded(model: nn.Module) -> None:
    """Raise ``ValueError`` naming any parameter or buffer still on the meta device.

    # NOTE: values that are not checkpoint tensors (RoPE tables, position ids) must not be buffers
    # created at build time: they would stay on meta. They are computed on first use on the input's device.
    """
    empty = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if empty:
        raise ValueError(f"tensors not loaded from the checkpoint: {', '.join(empty[:8])}"
                         + (f" and {len(empty) - 8} more" if len(empty) > 8 else ""))
