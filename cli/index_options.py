"""Index-building options shared by ``petal index`` and ``petal rebuild``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def index_options(func: F, *, first_run: bool = True) -> F:
    """``--metric``, ``--index-memory``, ``--target-recall``: no defaults, a flag not given is ``None`` and keeps the
    live version's setting (``petal index`` and ``petal rebuild``); ``first_run`` (``petal index``): the help says
    the default of a run with no live version too."""

    def default(value: Any) -> dict[str, Any]:
        return {"default": None, "show_default": kept_default(value if first_run else None)}

    func = click.option("--target-recall", type=click.FloatRange(0.0, 1.0, min_open=True), **default(0.95),
                        help="Recall@10 vs exact search that search parameters are tuned to.")(func)
    func = click.option("--index-memory", **default("8G"),
                        help="RAM the index build may use, in bytes with a binary unit (4G = 4 GiB, 512M = 512 MiB): "
                             "picks the codes and the IVF lists (half of it trains); IVF over it goes on disk.")(func)
    func = click.option("--metric", type=click.Choice(["ip", "l2"]), **default("ip"),
                        help="Similarity: ip (inner product; cosine for a model that normalises) or l2 "
                             "(Euclidean distance).")(func)
    return func


def kept_default(first: Any) -> str:
    """What ``--help`` shows as the default of an index setting: the live version's, ``first`` for a first run."""
    return "the live version's" + (f"; {first} for a first run" if first is not None else "")


def given_index_flags(index_factory: str | None, metric: str | None, index_memory: str | None,
                      target_recall: float | None) -> dict[str, Any]:
    """The index flags given, as the API's keywords: one left out keeps the live version's setting."""
    return {name: value for name, value in (("index_factory", index_factory), ("metric", metric),
                                            ("index_memory", index_memory), ("target_recall", target_recall))
            if value is not None}
