"""The in-memory checkpoints of tests, benchmarks and the pickle opt-in (safetensors files stream through
``engine/models/stream.py``; where a checkpoint's files are: ``engine/weight_files.py``)."""

from __future__ import annotations

from pathlib import Path

import torch


class WeightSource:
    """Tensors of a checkpoint by name, on the target device, floats in the target dtype."""

    files: list[Path]

    def get(self, name: str, prefixes: tuple[str, ...] = ("",)) -> torch.Tensor:
        """The tensor ``prefix + name`` for the first prefix present (``KeyError`` naming what was tried)."""
        raise NotImplementedError


def state_from_plan(weights: WeightSource, plan: dict[str, tuple[str, ...]],
                    prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Our parameter name -> its checkpoint tensors (``plan``) stacked along dim 0."""
    out: dict[str, torch.Tensor] = {}
    for name, parts in plan.items():
        tensors = [weights.get(part, prefixes) for part in parts]
        out[name] = tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=0)
    return out


class TensorWeights(WeightSource):
    """A checkpoint already in memory (a Hugging Face model's ``state_dict()``): tests and benchmarks."""

    def __init__(self, tensors: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype) -> None:
        self.device = device
        self.dtype = dtype
        self._tensors = tensors
        self._where = dict.fromkeys(tensors, 0)
        self.files = [Path("<memory>")]

    def get(self, name: str, prefixes: tuple[str, ...] = ("",)) -> torch.Tensor:
        for prefix in prefixes:
            tensor = self._tensors.get(prefix + name)
            if tensor is not None:
                tensor = tensor.to(self.device)
                return tensor.to(self.dtype) if tensor.is_floating_point() else tensor
        raise KeyError(f"weight {name!r} not found (tried {', '.join(repr(p + name) for p in prefixes)})")


def open_pickle_weights(files: list[Path], device: torch.device, dtype: torch.dtype) -> WeightSource:
    """A ``WeightSource`` over pickle files (only when the caller allowed them)."""
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        # NOTE: weights_only=True: torch's restricted unpickler (tensors and plain containers only), so
        # a pickle cannot run code; mmap avoids reading a multi-GB checkpoint into memory twice.
        state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
        if not isinstance(state, dict):
            raise KeyError(f"{f} does not hold a state dict (found {type(state).__name__})")
        tensors.update(state)
    weights = TensorWeights(tensors, device, dtype)
    weights.files = files
    return weights
