"""Run an iterator in a background thread, a bounded number of items ahead of its consumer;
map a function over an iterator on a few threads, results in input order."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
_DONE = object()


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int, window: int | None = None) -> Iterator[R]:
    """``map(fn, items)`` with up to ``workers`` calls running at once, results in input order.

    Pays when ``fn`` releases the GIL (Rust tokenizers): while one call converts its output in
    Python, another runs native code, and ``items`` (read and checked in the calling thread) are
    produced alongside. At most ``window`` (default ``2 * workers``) items are in flight.

    An exception raised by ``items`` is re-raised only after the results of every item before it
    were yielded, as a serial ``map`` would; one raised by ``fn`` is re-raised in its place.
    """
    if workers <= 1:
        yield from map(fn, items)
        return
    window = window or 2 * workers
    pending: deque[Future[R]] = deque()
    source = iter(items)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="petal-map") as pool:
        try:
            while True:
                while len(pending) < window:
                    try:
                        item = next(source)
                    except StopIteration:
                        break
                    except BaseException:
                        while pending:  # NOTE: what was read before the failure is delivered first
                            yield pending.popleft().result()
                        raise
                    pending.append(pool.submit(fn, item))
                if not pending:
                    return
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


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

    @property
    def empty(self) -> bool:
        """Nothing produced waits to be taken: the next ``next()`` blocks (unless the producer is quick)."""
        return self._queue.empty()

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
        return item

    def close(self) -> None:
        self._stop.set()
        self._finished = True
        self._thread.join(timeout=5)

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
