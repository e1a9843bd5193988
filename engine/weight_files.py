"""Where a checkpoint's weights are: its safetensors files, or its pickle files (loaded only when the user
allows them). Torch-free: ``ModelSpec`` and the model directory checks need these without a model."""

from __future__ import annotations

import json
from pathlib import Path

PICKLE_WEIGHT_NAMES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth")


def _indexed_shards(index: Path) -> list[Path]:
    """The shard files a ``*.index.json`` names (its ``weight_map`` values), all of which must exist."""
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    files = [index.parent / s for s in shards]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{index} names shards that are missing: {', '.join(missing)}")
    return files


def safetensors_files(model_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files: a single file or the shards an index names."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return _indexed_shards(index)
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    return sorted(model_dir.glob("*.safetensors"))


def pickle_files(model_dir: Path) -> list[Path]:
    """The checkpoint's pickle files (``pytorch_model.bin``, or the shards its index names)."""
    index = model_dir / "pytorch_model.bin.index.json"
    if index.is_file():
        return _indexed_shards(index)
    for name in ("pytorch_model.bin", "model.pt", "model.pth"):
        if (model_dir / name).is_file():
            return [model_dir / name]
    return []
