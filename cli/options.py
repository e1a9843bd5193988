"""Options for model families and output formats, shared by ``index``, ``embed`` and ``query``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


class FiniteFloatRange(click.FloatRange):
    """click's ``FloatRange`` that refuses NaN and infinity (a usage error naming the flag, exit 2). ``FloatRange``
    lets NaN through (it fails no comparison) and infinity wherever no ``max`` is given."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


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
