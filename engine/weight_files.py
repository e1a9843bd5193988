"""Where a checkpoint's weights are: its safetensors files, or its pickle files (loaded only when the user
allows them). Torch-free: ``ModelSpec`` and the model directory checks need these without a model."""

from __future__ import annotations

import json
from pathlib import Path

PICKLE_WEIGHT_NAMES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth")


class WeightFilesError(ValueError):
    """A checkpoint index (``*.index.json``) that cannot be read, or names shards that are not there."""


def _indexed_shards(index: Path) -> list[Path]:
    """The shard files a ``*.index.json`` names (its ``weight_map`` values), all of which must exist."""
    try:
        content = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # NOTE: ValueError: not JSON, or bytes that are not UTF-8
        raise WeightFilesError(f"cannot read {index}: {exc}") from exc
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or \
            not all(isinstance(s, str) and s for s in weight_map.values()):
        raise WeightFilesError(f"{index}: weight_map must be an object of tensor names and shard file names, "
                               f"not {str(weight_map)[:80]!r}")
    files = [index.parent / s for s in sorted(set(weight_map.values()))]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise WeightFilesError(f"{index} names shards that are missing: {', '.join(missing)}")
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
