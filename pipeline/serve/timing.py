"""Per-request server spans, answered in a ``Server-Timing`` header (the W3C header browsers and load
generators read): ``tokenize`` (on the engine thread: the batch the request's texts were tokenized in),
``engine`` (queue + engine step, as the request waited for it, less ``tokenize``), ``search``,
``encode`` and ``app`` (the whole handler), in milliseconds.

``petal bench serve`` reads them to split a client's latency into the server's parts and the HTTP and
client share. A few ``perf_counter`` calls a request; the spans live in a context variable of the
request's task, so concurrent requests never mix.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager

SPANS: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("petal_serve_spans", default=None)


@contextmanager
def span(name: str) -> Iterator[None]:
    """Time the block as ``name`` (added up if the request runs it twice)."""
    started = time.perf_counter()
    try:
        yield
    finally:
        spans = SPANS.get()
        if spans is not None:
            spans[name] = spans.get(name, 0.0) + time.perf_counter() - started


def record(name: str, seconds: float) -> None:
    """Add ``seconds`` to the span ``name`` (a time measured elsewhere, e.g. on the engine thread)."""
    spans = SPANS.get()
    if spans is not None:
        spans[name] = spans.get(name, 0.0) + seconds


def header(spans: dict[str, float]) -> str:
    return ", ".join(f"{name};dur={1000 * seconds:.3f}" for name, seconds in spans.items())
