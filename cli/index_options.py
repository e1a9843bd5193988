"""Index-building options shared by ``petal index`` and ``petal rebuild``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def index_options(func: F) -> F:
    """``--metric``, ``--index-memory``, ``--target-recall``."""
    func = click.option("--target-recall", type=click.FloatRange(0.0, 1.0, min_open=True), default=0.95,
                        show_default=True, help="Recall@10 vs exact search that search parameters are tuned to.")(func)
    func = click.option("--index-memory", default="8G", show_default=True,
                        help="RAM the index may use (e.g. 4G, 512M): picks the codes; IVF over it goes on disk.")(func)
    func = click.option("--metric", type=click.Choice(["ip", "l2"]), default="ip", show_default=True)(func)
    return func
