"""Index-building options shared by ``petal index`` and ``petal rebuild``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def index_options(func: F, *, kept: bool = False) -> F:
    """``--metric``, ``--index-memory``, ``--target-recall``. ``kept`` (``petal rebuild``): no defaults, a flag not
    given is ``None`` and keeps the live version's setting."""

    def default(value: Any) -> dict[str, Any]:
        return {"default": None, "show_default": "the live version's"} if kept else {"default": value,
                                                                                       "show_default": True}

    func = click.option("--target-recall", type=click.FloatRange(0.0, 1.0, min_open=True), **default(0.95),
                        help="Recall@10 vs exact search that search parameters are tuned to.")(func)
    func = click.option("--index-memory", **default("8G"),
                        help="RAM the index may use, in bytes with a binary unit (4G = 4 GiB, 512M = 512 MiB): picks "
                             "the codes; IVF over it goes on disk.")(func)
    func = click.option("--metric", type=click.Choice(["ip", "l2"]), **default("ip"),
                        help="Similarity: ip (inner product; cosine for a model that normalises) or l2 "
                             "(Euclidean distance).")(func)
    return func
