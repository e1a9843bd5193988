"""The in-memory checkpoints of tests, benchmarks and the pickle opt-in (safetensors files stream through
``engine/models/stream.py``; where a checkpoint's files are: ``engine/weight_files.py``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from petal.engine.weight_files import named, tensor_homes


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


def unread_model_tensors(names: Iterable[str], plan: Mapping[str, tuple[str, ...]],
                         prefixes: tuple[str, ...]) -> list[str]:
    """Checkpoint tensors the model does not read but names like its own: ``encoder.layer.7.*`` when config.json
    says 6 layers, so the checkpoint and its config disagree and loading would drop part of the model silently.
    Other unread tensors (a pooler, a task head, saved position ids, RoPE tables) are not the model's and stay
    unread."""
    parts = {part for group in plan.values() for part in group}
    shapes = {_INDEX.sub("#", part) for part in parts}
    unread = []
    for name in names:
        rests = [name[len(prefix):] for prefix in prefixes if name.startswith(prefix)]
        if not any(rest in parts for rest in rests) and any(_INDEX.sub("#", rest) in shapes for rest in rests):
            unread.append(name)
    return sorted(unread)


def describe_unread(unread: list[str]) -> str:
    shown = ", ".join(unread[:4]) + (f" and {len(unread) - 4} more" if len(unread) > 4 else "")
    return (f"tensors the model would not read: {shown} (does config.json give fewer layers or smaller sizes than "
            "the checkpoint holds?)")


_INDEX = re.compile(r"(?<=\.)\d+(?=\.)")  # a layer number inside a tensor name: encoder.layer.7.output...


class TensorWeights(WeightSource):
    """A checkpoint already in memory (a Hugging Face model's ``state_dict()``): tests and benchmarks."""

    def __init__(self, tensors: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype) -> None:
        self.device = device
        self.dtype = dtype
        self._tensors = tensors
        self._where = dict.fromkeys(tensors, 0)
        self.files = [Path("<memory>")]

    def names(self) -> list[str]:
        return list(self._tensors)

    def get(self, name: str, prefixes: tuple[str, ...] = ("",)) -> torch.Tensor:
        for prefix in prefixes:
            tensor = self._tensors.get(prefix + name)
            if tensor is not None:
                tensor = tensor.to(self.device)
                return tensor.to(self.dtype) if tensor.is_floating_point() else tensor
        raise KeyError(f"weight {name!r} not found (tried {', '.join(repr(p + name) for p in prefixes)})")


def open_pickle_weights(files: list[Path], device: torch.device, dtype: torch.dtype) -> TensorWeights:
    """A ``WeightSource`` over pickle files (only when the caller allowed them); a file that does not load as a
    state dict of tensors is a ``ValueError`` naming it."""
    states: list[dict[str, torch.Tensor]] = []
    for f in files:
        state = _torch_load(f)
        if not isinstance(state, dict):
            raise ValueError(f"{f} does not hold a state dict (found {type(state).__name__})")
        odd = next(((k, v) for k, v in state.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)),
                   None)
        if odd is not None:
            raise ValueError(f"{f}: {odd[0]!r} is {type(odd[1]).__name__}, not a tensor: not a state dict")
        states.append(state)
    tensors = {name: tensor for name, (_, tensor) in tensor_homes(files, states).items()}
    weights = TensorWeights(tensors, device, dtype)
    weights.files = files
    return weights


def _torch_load(path: Path) -> object:
    # NOTE: weights_only=True: torch's restricted unpickler (tensors and plain containers only), so
    # a pickle cannot run code; mmap avoids reading a multi-GB checkpoint into memory twice. A file torch saved
    # before its zip format (1.6) cannot be mapped: it is read whole instead.
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)
    except OSError as exc:  # NOTE: the file could not be read: permission denied 66, a read error 74, no bad model
        raise named(exc, path) from None
    except Exception as exc:  # NOTE: a damaged or hostile file: torch raises whatever its unpickler meets
        # torch's refusal is paragraphs of advice around one line of reason (advice to load unsafely: not ours)
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reasons = [line for line in lines if not line.startswith(_TORCH_ADVICE)] or lines or [type(exc).__name__]
        raise ValueError(f"cannot load {path} as weights (torch.load, weights_only=True): {reasons[0]}") from exc


_TORCH_ADVICE = ("Weights only load failed", "Please file an issue", "Check the documentation")
