"""What every native model class offers the loader: its family (``families.py``: the reading of a Hugging Face
config, the attention masks, the default pooling) and the mapping of a checkpoint's tensors to its parameters."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from petal.engine.config import ModelConfig
from petal.engine.context import ForwardContext
from petal.engine.models.families import Family
from petal.engine.models.weights import WeightSource, state_from_plan


class EncoderModel(nn.Module):
    """A packed encoder: ``forward(input_ids [T], positions [T], ctx) -> [T, hidden]``."""

    family: ClassVar[Family]  # the config reading, masks and default pooling (torch-free, for the loader)
    weight_prefixes: tuple[str, ...] = ("",)  # checkpoints saved from task heads prefix the trunk

    @classmethod
    def config_from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        return cls.family.config_from_hf(hf)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        raise NotImplementedError

    fused_weights: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (".qkv.", (".query.", ...)): parts stacked on dim 0

    def weight_plan(self) -> dict[str, tuple[str, ...]]:
        """Our parameter name -> the checkpoint tensors (Hugging Face names, no prefix) stacked along dim 0 into it."""
        plan: dict[str, tuple[str, ...]] = {}
        for name in self.state_dict():
            marker, parts = next(((m, p) for m, p in self.fused_weights if m in name), ("", ()))
            plan[name] = tuple(name.replace(marker, part) for part in parts) if parts else (name,)
        return plan

    def hf_state_dict(self, weights: WeightSource) -> dict[str, torch.Tensor]:
        """Our parameter names -> tensors read from a Hugging Face checkpoint held in memory (``weight_plan``)."""
        return state_from_plan(weights, self.weight_plan(), self.weight_prefixes)
