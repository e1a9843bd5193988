"""What every command shares: error-to-exit-code mapping, the offline guard, common options."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def offline() -> None:
    """No network at run time: set before any Hugging Face import."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


class PetalClickError(click.ClickException):
    """A user-facing failure with the exit code of the contract (65, 66, 73, 74, 75, 78, ...)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file: Any = None) -> None:
        click.echo(f"petal: error: {self.format_message()}", err=True)


def user_errors(func: F) -> F:
    """Turn ``PetalError`` (and a model's ``ModelError``) into a clean message and its exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from petal.engine.errors import ModelError
        from petal.pipeline.reliability.errors import EXIT_CONFIG, PetalError

        try:
            return func(*args, **kwargs)
        except PetalError as exc:
            raise PetalClickError(str(exc), exc.exit_code) from exc
        except ModelError as exc:
            raise PetalClickError(str(exc), EXIT_CONFIG) from exc

    return wrapper  # type: ignore[return-value]


def usage(fn: Callable[[], Any]) -> Any:
    """Run a constructor that validates flags; its ``ValueError`` becomes a usage error (exit 2)."""
    try:
        return fn()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def device_options(func: F) -> F:
    func = click.option("--attention", type=click.Choice(["auto", "flashinfer", "torch", "sdpa"]), default="auto",
                        show_default=True, help="Attention kernel (auto: FlashInfer on CUDA when it fits).")(func)
    func = click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
                        show_default=True, help="GEMM precision (auto: bfloat16 on CUDA, float32 on the CPU).")(func)
    func = click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                        help="Where the model runs.")(func)
    return func


def eprint(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
