"""Where a checkpoint's weights are: its safetensors files, or its pickle files (loaded only when the user
allows them). Torch-free: ``ModelSpec`` and the model directory checks need these without a model."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

DENIED = (errno.EACCES, errno.EPERM)  # permission denied (pipeline/reliability/errors.py's DENIED; the engine
# imports no pipeline code)
PICKLE_WEIGHT_NAMES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth")


class WeightFilesError(ValueError):
    """A checkpoint index (``*.index.json``) that cannot be read, or names shards that are not there."""


def is_denied(exc: BaseException) -> bool:
    """A file of the model that this process may not read (EACCES, EPERM): the ``OSError`` goes up as it is (its
    ``filename`` names the file), never wrapped as a model error (exit 78): the CLI makes it 66, as any other
    file petal reads and is denied."""
    return isinstance(exc, OSError) and exc.errno in DENIED


def check_readable(files: list[Path]) -> None:
    """The ``PermissionError`` of the first of ``files`` this process may not open for reading (any other failure
    is left to the reader that says what is wrong with the file).

    NOTE: the libraries that read the weights and the tokenizer later wrap a denied open in their own errors
    (safetensors, torch.load, the tokenizers library's bare ``Exception``), which read as a damaged model (78)."""
    for file in files:
        try:
            os.close(os.open(file, os.O_RDONLY | os.O_NONBLOCK))
        except OSError as exc:
            if is_denied(exc):
                raise


def _indexed_shards(index: Path) -> list[Path]:
    """The shard files a ``*.index.json`` names (its ``weight_map`` values), all of which must exist."""
    try:
        content = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # NOTE: ValueError: not JSON, or bytes that are not UTF-8
        if is_denied(exc):
            raise  # NOTE: a file petal may not read is no bad checkpoint: 66 naming it, not 78
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
