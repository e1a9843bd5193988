"""The header of a safetensors file, read and checked without the ``safetensors`` package.

Layout: 8 bytes little-endian header length ``N``, ``N`` bytes of JSON (``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {...}}``), then the data; offsets count from the
data's start. Every entry is checked against the file's size, so a truncated or forged file is
refused here, by name, before anything is read or allocated.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from petal.engine.weight_files import named

MAX_HEADER_BYTES = 100 << 20  # the safetensors package's own limit

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}


class SafetensorsError(ValueError):
    """A safetensors file whose header is unreadable or disagrees with the file."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file: where its bytes lie (absolute file offsets) and what they hold."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # first byte, from the start of the file
    end: int  # one past the last byte

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def row_bytes(self) -> int:
        """Bytes of one slice along dim 0 (the whole tensor for a scalar)."""
        return self.nbytes if not self.shape else self.nbytes // max(self.shape[0], 1)


def read_header(path: Path) -> dict[str, TensorEntry]:
    """The tensors of ``path`` by name. Raises ``SafetensorsError`` naming the file and the entry."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise SafetensorsError(f"{path}: {size} bytes, too short for a safetensors file")
            length = int.from_bytes(prefix, "little")
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise SafetensorsError(f"{path}: header length {length} does not fit the file ({size} bytes)")
            raw = fh.read(length)
    except OSError as exc:  # NOTE: the file could not be read: permission denied 66, a read error 74, no bad model
        raise named(exc, path) from None
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # NOTE: '[[[[...': too deep; an int of over 4,300 digits
        raise SafetensorsError(f"{path}: the header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: the header is not a JSON object")
    data_start = 8 + length
    entries: dict[str, TensorEntry] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        entries[name] = _entry(path, name, info, data_start, size)
    _refuse_overlaps(path, entries)
    return entries


def _refuse_overlaps(path: Path, entries: dict[str, TensorEntry]) -> None:
    """Two tensors whose bytes overlap are a forged header (the safetensors package refuses it too, InvalidOffset):
    before, such a file loaded, one weight read as another's bytes, and the model embedded with it, exit 0."""
    spans = sorted((e for e in entries.values() if e.nbytes), key=lambda e: (e.begin, e.end))
    for before, after in itertools.pairwise(spans):
        if after.begin < before.end:
            raise SafetensorsError(f"{path}: tensors {before.name!r} (bytes {before.begin}-{before.end}) and "
                                   f"{after.name!r} (bytes {after.begin}-{after.end}) overlap: the header is "
                                   "damaged or forged")


def _entry(path: Path, name: str, info: object, data_start: int, size: int) -> TensorEntry:
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict):
        raise SafetensorsError(f"{where}: entry is not an object")
    dtype = SAFETENSORS_DTYPES.get(str(info.get("dtype")))
    if dtype is None:
        raise SafetensorsError(f"{where}: dtype {info.get('dtype')!r} is not supported "
                               f"(known: {', '.join(SAFETENSORS_DTYPES)})")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
            or not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)):
        raise SafetensorsError(f"{where}: bad shape {shape!r} or data_offsets {offsets!r}")
    begin, end = data_start + offsets[0], data_start + offsets[1]
    expected = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if not data_start <= begin <= end <= size or end - begin != expected:
        raise SafetensorsError(f"{where}: data_offsets {offsets} do not hold {shape} {info['dtype']} "
                               f"({expected} bytes) inside the file ({size} bytes)")
    return TensorEntry(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)
