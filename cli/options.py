"""Options for model families and output formats, shared by ``index``, ``embed`` and ``query``."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def loading_options(func: F) -> F:
    """``--query-prompt``, ``--allow-pickle-weights``."""
    func = click.option("--allow-pickle-weights", is_flag=True,
                        help="Load pytorch_model.bin when there is no safetensors file "
                             "(torch.load with weights_only=True). Off: such models are refused.")(func)
    func = click.option("--query-prompt", default=None,
                        help="Text put before every query (default: the model's 'query' prompt from "
                             "config_sentence_transformers.json, e.g. 'Instruct: ...\\nQuery:').")(func)
    return func


def model_options(func: F) -> F:
    """``--pooling``, ``--attention-mask`` and the ``loading_options``."""
    func = loading_options(func)
    func = click.option("--attention-mask", type=click.Choice(["causal", "bidirectional"]), default=None,
                        help="Qwen3 family: causal (Qwen3-Embedding) or bidirectional (pplx-embed), when "
                             "config.json does not say.")(func)
    func = click.option("--pooling", type=click.Choice(["mean", "cls", "last"]), default=None,
                        help="Pooling, when the model's files do not say (or to override them).")(func)
    return func


def output_options(func: F) -> F:
    """``--dim``, ``--quantize``, ``--output-dtype``."""
    func = click.option("--output-dtype", type=click.Choice(["float32", "float16"]), default="float32",
                        show_default=True, help="Type of float vectors (float16: half the size).")(func)
    func = click.option("--quantize", type=click.Choice(["none", "int8", "binary"]), default="none",
                        show_default=True,
                        help="int8: the model's own scheme (pplx-embed: tanh) or per-dimension ranges learned "
                             "from the corpus; binary: sign bits, Hamming search with float rescoring.")(func)
    func = click.option("--dim", type=click.IntRange(min=1), default=None,
                        help="Matryoshka: keep the first N dimensions (renormalised when the model normalises).")(func)
    return func


def input_file_size(flag: str, path: Path) -> int:
    """The size in bytes of the input file ``flag`` names (``--input``, ``--vector-file``), once it is known to
    be one this process can read; else ``NoInputError`` (66, sysexits' "cannot open input") naming the flag and
    the path: it does not exist, is not a regular file (a directory, a FIFO, a device) or cannot be opened for
    reading (permission). Nothing is read, and a FIFO never blocks (opened non-blocking): a missing file costs no
    import of torch, FAISS or Arrow. An empty file (0) is for the caller to judge: it holds no rows."""
    from petal.pipeline.reliability.errors import NoInputError, quote_path

    where = f"{flag} {quote_path(path)}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise NoInputError(f"{where}: no such file") from None
    except OSError as exc:  # permission denied, a symlink loop, a name too long
        raise NoInputError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if stat.S_ISDIR(info.st_mode):
        raise NoInputError(f"{where} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise NoInputError(f"{where} is not a regular file (a FIFO, a device or a socket)")
    return info.st_size
