"""Run an iterator in a background thread, a bounded number of items ahead of its consumer."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


class Prefetcher(Iterator[T]):
    """Iterates ``source`` in a daemon thread, at most ``depth`` items ahead.

    An exception raised by ``source`` is re-raised in the consumer at the point it happened.
    ``close()`` stops the producer at its next item.
    """

    def __init__(self, source: Iterable[T], depth: int = 4, name: str = "petal-prefetch") -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, args=(source,), name=name, daemon=True)
        self._finished = False
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self, source: Iterable[T]) -> None:
        try:
            for item in source:
                if not self._put(item):
                    return
            self._put(_DONE)
        except BaseException as exc:
            self._put(exc)

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        item = self._queue.get()
        if item is _DONE:
            self._finished = True
            raise StopIteration
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        return item  # type: ignore[return-value]

    def close(self) -> None:
        self._stop.set()
        self._finished = True
        self._thread.join(timeout=5)

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
