"""Reading Hugging Face safetensors checkpoints tensor by tensor, straight to the target device."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open


class WeightSource:
    """All tensors of a checkpoint (one ``model.safetensors`` or an index of shards), by name."""

    def __init__(self, files: list[Path], device: torch.device, dtype: torch.dtype) -> None:
        self.device = device
        self.dtype = dtype
        self._handles = [safe_open(str(f), framework="pt", device=str(device)) for f in files]
        self._where: dict[str, int] = {}
        for i, handle in enumerate(self._handles):
            for key in handle.keys():  # noqa: SIM118 (safe_open has keys() but no __iter__)
                self._where.setdefault(key, i)
        self.files = files

    def keys(self) -> list[str]:
        return list(self._where)

    def get(self, name: str, prefixes: tuple[str, ...] = ("",)) -> torch.Tensor:
        """The tensor ``prefix + name`` for the first prefix present, floats cast to ``dtype``."""
        for prefix in prefixes:
            key = prefix + name
            if key in self._where:
                tensor = self._handles[self._where[key]].get_tensor(key)
                return tensor.to(self.dtype) if tensor.is_floating_point() else tensor
        tried = ", ".join(repr(p + name) for p in prefixes)
        raise KeyError(f"weight {name!r} not found in {', '.join(str(f) for f in self.files)} (tried {tried})")


def safetensors_files(model_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files: a single file or the shards an index names."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / s for s in shards]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shards that are missing: {', '.join(missing)}")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    return sorted(model_dir.glob("*.safetensors"))


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
