"""Where a checkpoint's weights are: its safetensors files, or its pickle files (loaded only when the user
allows them). Torch-free: ``ModelSpec`` and the model directory checks need these without a model."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

DENIED = (errno.EACCES, errno.EPERM)  # permission denied (pipeline/reliability/errors.py's DENIED; the engine
# imports no pipeline code)
INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
T = TypeVar("T")
PICKLE_WEIGHT_NAMES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth")


class ModelFileError(ValueError):
    """A file of a model directory that is there but is no file petal can use (a directory, a FIFO, a symbolic link
    to nothing), or whose content is wrong: the loader's ``ModelError`` (78), the message naming the file."""


class WeightFilesError(ModelFileError):
    """A checkpoint index (``*.index.json``) that cannot be read, or names shards that are not there."""


_NOT_FILES = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def model_file(path: Path) -> bool:
    """Whether a file of a model directory is there: ``False`` when nothing is at ``path`` (or its folder is no
    directory), ``True`` for a regular file or a link to one. Anything else there is a ``ModelFileError`` naming
    it, never taken for absent: a directory, a FIFO (whose read would block), a socket or device, a symbolic link
    to nothing or a link loop. Permission denied and any other ``OSError`` go up as they are (66, 74)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if not os.path.islink(path):
            return False
        raise ModelFileError(f"{path} is a broken symbolic link (to {os.readlink(path)}, which does not exist)") \
            from None
    except NotADirectoryError:
        return False
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ModelFileError(f"{path} is a symbolic link loop (too many levels of symbolic links)") from None
        raise
    if stat.S_ISREG(mode):
        return True
    kind = next((name for test, name in _NOT_FILES if test(mode)), "no regular file")
    raise ModelFileError(f"{path} is {kind}, not a file")


def read_text(path: Path) -> str:
    """``path``'s text (UTF-8; bytes that are not: ``ValueError``). An ``OSError`` goes up naming ``path`` (a
    failed read, unlike a failed open, carries no file name): the CLI makes permission denied 66, anything else
    (EIO) 74, never a damaged model (78)."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise named(exc, path) from None


def named(exc: OSError, path: Path) -> OSError:
    """``exc`` naming ``path`` when it names no file."""
    if exc.filename is None:
        exc.filename = str(path)
    return exc


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


def _inside(shard: str) -> bool:
    """Whether a shard file name of an index stays in the index's folder: relative, no ``..`` part, no NUL (a
    symbolic link inside the folder is the user's choice and is followed; a name that leaves it is refused)."""
    parts = shard.replace("\\", "/").split("/")
    return not (shard.startswith(("/", "\\")) or os.path.isabs(shard) or ".." in parts or "\0" in shard
                or (len(shard) > 1 and shard[1] == ":"))


def _indexed_shards(index: Path) -> list[Path]:
    """The shard files a ``*.index.json`` names (its ``weight_map`` values), all of which must exist."""
    return sorted(set(_weight_map(index).values()))


def _weight_map(index: Path) -> dict[str, Path]:
    """A ``*.index.json``'s ``weight_map``: tensor name -> its shard file (in the index's folder, which exists)."""
    try:
        # NOTE: an OSError goes up naming the file: permission denied 66, a read error 74, no bad checkpoint (78)
        content = json.loads(read_text(index))
    except (ValueError, RecursionError) as exc:  # NOTE: not JSON, bytes that are not UTF-8, '[[[[...' too deep
        raise WeightFilesError(f"cannot read {index}: {exc}") from exc
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or \
            not all(isinstance(s, str) and s for s in weight_map.values()):
        raise WeightFilesError(f"{index}: weight_map must be an object of tensor names and shard file names, "
                               f"not {str(weight_map)[:80]!r}")
    outside = [f"{name!r}: {shard!r}" for name, shard in weight_map.items() if not _inside(shard)]
    if outside:
        raise WeightFilesError(f"{index}: weight_map names shard files outside the model directory "
                               f"({', '.join(outside[:4])}); shard files must lie in {index.parent}")
    files = [index.parent / s for s in sorted(set(weight_map.values()))]
    missing = [str(f) for f in files if not model_file(f)]
    if missing:
        raise WeightFilesError(f"{index} names shards that are missing: {', '.join(missing)}")
    return {name: index.parent / shard for name, shard in weight_map.items()}


def tensor_homes(files: Sequence[Path], contents: Sequence[Mapping[str, T]]) -> dict[str, tuple[int, T]]:
    """Each tensor name of ``contents`` (one mapping per file of ``files``) -> (its file's index, its entry): the
    shard the checkpoint index's ``weight_map`` names for it when ``files`` are that index's shards (as
    transformers reads them: a tensor two shards hold is the one the index names), else the first file holding it."""
    owners: dict[str, Path] = {}
    for name in INDEX_NAMES if files else ():
        index = files[0].parent / name
        if model_file(index):
            weight_map = _weight_map(index)
            if sorted(set(weight_map.values())) == sorted(files):
                owners = weight_map
                break
    homes: dict[str, tuple[int, T]] = {}
    for i, (file, content) in enumerate(zip(files, contents)):
        for key, value in content.items():
            if key not in homes or owners.get(key) == file:
                homes[key] = (i, value)
    return homes


def safetensors_files(model_dir: Path) -> list[Path]:
    """The checkpoint's safetensors files: the single file, else the shards an index names (the order of
    transformers' ``from_pretrained``: a directory with both loads ``model.safetensors``)."""
    single = model_dir / "model.safetensors"
    if model_file(single):
        return [single]
    index = model_dir / "model.safetensors.index.json"
    if model_file(index):
        return _indexed_shards(index)
    return [f for f in sorted(model_dir.glob("*.safetensors")) if model_file(f)]


def pickle_files(model_dir: Path) -> list[Path]:
    """The checkpoint's pickle files (``pytorch_model.bin``, or the shards its index names)."""
    if model_file(model_dir / "pytorch_model.bin"):  # NOTE: before its index, as transformers loads them
        return [model_dir / "pytorch_model.bin"]
    index = model_dir / "pytorch_model.bin.index.json"
    if model_file(index):
        return _indexed_shards(index)
    for name in ("model.pt", "model.pth"):
        if model_file(model_dir / name):
            return [model_dir / name]
    return []
