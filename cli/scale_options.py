"""``--devices``, ``--workers`` and ``--ray``: the scale-out options of ``petal index`` (and ``petal bench e2e``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])
RAY_LOCAL = "local"  # ``--ray`` without an address: RAY_ADDRESS if set, else a Ray instance on this host


def scale_options(func: F) -> F:
    func = click.option("--range-rows", type=click.IntRange(min=0), default=None, metavar="N",
                        help="With --devices/--workers/--ray: hand out a shard of more than N rows as row-group "
                             "ranges of about N rows, each committed on its own (0: whole shards only) "
                             "[default: 100000].")(func)
    func = click.option("--ray", "ray", is_flag=False, flag_value=RAY_LOCAL, default=None, metavar="[ADDRESS]",
                        help="Embed on a Ray cluster through Ray Data (ADDRESS: ray://host:10001 or auto; "
                             "without one: RAY_ADDRESS, else a local Ray). Needs pip install 'petal[ray]'.")(func)
    func = click.option("--workers", type=click.IntRange(min=1), default=None,
                        help="Worker processes that embed (each reads and tokenizes its own shards); with "
                             "--devices, spread over the devices [default: one per device].")(func)
    func = click.option("--devices", default=None, metavar="all|N|0,1",
                        help="CUDA devices to embed on, one worker process each: all, a count, or device ids.")(func)
    return func


def scale_config(devices: str | None, workers: int | None, ray: str | None, range_rows: int | None = None) -> Any:
    """The ``ScaleConfig`` of the flags, or ``None`` (embed in this process). Raises ``ValueError``."""
    from petal.pipeline.config import ScaleConfig

    if devices is None and workers is None and ray is None:
        if range_rows is not None:
            raise ValueError("--range-rows goes with --devices, --workers or --ray")
        return None
    if ray is not None and devices is not None:
        raise ValueError("--ray places its actors on the cluster's GPUs itself: drop --devices")
    return ScaleConfig(devices=devices, workers=workers, ray=ray is not None,
                       ray_address=None if ray in (None, RAY_LOCAL) else ray, range_rows=range_rows)
