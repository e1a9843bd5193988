"""Batching searches across requests: the query vectors of every request queued while a search runs
go to the index in one call (FAISS spreads a batch over its threads; a GPU copy does one matmul).

```
event loop    search(index, vectors, k, where, nprobe, rescore) -> queue -> await the request's future
search thread take everything queued -> group by (version, k, where, nprobe, rescore) -> one search
              per group (the rows of all its requests stacked) -> each request's rows of hits back
```

A lone request is searched at once (no timer); under load the requests that arrive during one search
form the next batch, as the token batcher does for engine steps. A search by query texts is admitted
on the event loop before its texts are embedded (``reserve``) and its vectors go from the engine thread
straight to this queue (``SearchTicket.submit``): no event-loop round trip between the step and the
search on a request's critical path. A lone one (nothing else queued for the engine or for a search)
whose version has a GPU copy is searched right there on the engine thread (``submit(rows, inline=True)``):
a graph replay of a fraction of a millisecond, without waking the search thread. A group searches exactly what the
request would have searched alone: the same version, k, filter and parameters. The queue is bounded in
query rows, as the token batcher's is in texts (``Overloaded``: 503 with Retry-After).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from petal.pipeline.index.search import Hit
from petal.pipeline.jobs.query import SearchIndex
from petal.pipeline.reliability.faults import fault
from petal.pipeline.serve.batcher import Overloaded, ShuttingDown, ThreadStopped, call_soon, thread_died
from petal.pipeline.serve.gpu_search import GpuReaders
from petal.pipeline.serve.searching import SharedExclusiveLock, overrides, search_params

MAX_BATCH_ROWS = 1024  # query rows per search call


@dataclass(frozen=True)
class SearchKey:
    """What must be equal for requests to share a search call."""

    index: int  # id() of the SearchIndex (one version)
    model_vectors: bool  # rows are the model's vectors (the index-time transform applies) or the index's
    k: int
    where: str | None
    nprobe: int | None
    rescore: int | None


class _Pending:
    __slots__ = ("future", "index", "inline_s", "key", "loop", "rows")

    def __init__(self, loop: asyncio.AbstractEventLoop, index: SearchIndex, key: SearchKey, rows: np.ndarray) -> None:
        self.loop = loop
        self.future: asyncio.Future[list[list[Hit]]] = loop.create_future()
        self.index = index
        self.key = key
        self.rows = rows
        self.inline_s = 0.0  # searched on the submitting thread (SearchTicket.submit(inline=True)): its time


class SearchTicket:
    """An admitted search whose query vectors come later, from any thread (``SearchBatcher.reserve``).

    ``submit(rows)`` queues it (the engine thread calls it as soon as the step's rows are read);
    ``cancel()`` gives its place in the queue back if it will never be submitted (the embedding failed).
    Await ``hits()`` (or ``future``) for the hits."""

    __slots__ = ("_batcher", "_item", "_state", "future")

    def __init__(self, batcher: SearchBatcher, item: _Pending) -> None:
        self._batcher = batcher
        self._item = item
        self._state = "reserved"  # -> "submitted" | "cancelled", under the batcher's lock
        self.future = item.future

    def submit(self, rows: np.ndarray, inline: bool = False) -> None:
        """Queue the search of ``rows`` ``[n, dim]`` (the model's vectors). ``inline``: the caller has nothing
        else to do (the engine thread after a lone request's step): if no other search is queued or running
        and the version has a GPU copy, search on the calling thread now and settle the future from here."""
        self._batcher._submit(self, np.ascontiguousarray(rows, dtype=np.float32), inline)

    @property
    def inline_s(self) -> float:
        """Seconds this search ran on the submitting thread (0.0: it went to the search thread)."""
        return self._item.inline_s

    def cancel(self) -> None:
        self._batcher._cancel(self)

    async def hits(self) -> list[list[Hit]]:
        """The hits; a cancelled wait (the client closed the connection) takes the search out of the queue if it
        has not started."""
        return await self._batcher._answer(self._item)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _settle_all(done: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, error in done:
        _settle(future, result, error)


class SearchBatcher:
    """One thread searching the queued requests' vectors, grouped into as few calls as their keys allow."""

    def __init__(self, params_lock: SharedExclusiveLock, gpu: GpuReaders | None = None,
                 max_queue_rows: int | None = None) -> None:
        self.params_lock = params_lock
        self.gpu = gpu
        self.max_queue_rows = max_queue_rows  # query rows queued or being searched (None: unbounded)
        self._outstanding = 0
        self._searching = 0  # searches running now (the search thread's batch, an inline one)
        self._pending: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._taken: list[_Pending] | None = None  # what the search thread took off the queue and searches now
        # set by the server: this thread ended on an unexpected error (the server stops)
        self.on_death: Callable[[ThreadStopped], None] = lambda stopped: None
        self._thread = threading.Thread(target=self._run, name="petal-search", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout_s: float = 30.0) -> bool:
        """Stop the search thread: searches still queued are answered ``ShuttingDown`` (503), the one running
        finishes. True once the thread has ended (waits up to ``timeout_s``)."""
        with self._cond:
            self._closed = True
            dropped = list(self._pending)
            self._pending.clear()
            self._outstanding -= sum(len(item.rows) for item in dropped)
            self._cond.notify()
        for item in dropped:
            call_soon(item.loop, _settle, item.future, None, ShuttingDown())
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    async def search(self, index: SearchIndex, rows: np.ndarray, model_vectors: bool, k: int,
                     where: str | None = None, nprobe: int | None = None,
                     rescore: int | None = None) -> list[list[Hit]]:
        """Hits of ``rows`` ``[n, dim]``: the model's vectors (``model_vectors``: they go through the index-time
        transform first, as ``SearchIndex.search``) or vectors in the index's space (``search_stored``).
        ``FilterError`` for a bad ``where``."""
        key = SearchKey(id(index), model_vectors, k, where, nprobe, rescore)
        item = _Pending(asyncio.get_running_loop(), index, key, np.ascontiguousarray(rows, dtype=np.float32))
        with self._cond:
            self._admit(len(item.rows))
            self._pending.append(item)
            self._cond.notify()
        return await self._answer(item)

    async def _answer(self, item: _Pending) -> list[list[Hit]]:
        try:
            return await item.future
        except asyncio.CancelledError:
            self._withdraw(item)
            raise

    def _withdraw(self, item: _Pending) -> None:
        """(event loop) ``item``'s request was cancelled (its client closed the connection): out of the queue, its
        rows' place given back, if the search thread has not taken it (taken, it is searched and its hits dropped)."""
        with self._cond:
            try:
                self._pending.remove(item)  # NOTE: by identity (no __eq__)
            except ValueError:  # being searched, searched, or never queued (a reserved ticket: cancel())
                return
            self._outstanding -= len(item.rows)

    def reserve(self, index: SearchIndex, num_rows: int, k: int, where: str | None = None,
                nprobe: int | None = None, rescore: int | None = None) -> SearchTicket:
        """(event loop) Admit a search of ``num_rows`` model vectors that are not computed yet: counted
        against the queue bound now (``Overloaded`` before any embedding work), queued on ``submit``."""
        item = _Pending(asyncio.get_running_loop(), index, SearchKey(id(index), True, k, where, nprobe, rescore),
                        np.empty((num_rows, 0), dtype=np.float32))
        with self._cond:
            self._admit(num_rows)
        return SearchTicket(self, item)

    def _admit(self, num_rows: int) -> None:
        """Count ``num_rows`` against the bound (``Overloaded`` past it or when closed); the lock is held."""
        if self._closed:
            raise ShuttingDown()
        if self.max_queue_rows is not None and self._outstanding + num_rows > self.max_queue_rows:
            raise Overloaded(f"{self._outstanding} query rows wait for a search (limit {self.max_queue_rows}, "
                             "--max-queue-texts)")
        self._outstanding += num_rows

    def _submit(self, ticket: SearchTicket, rows: np.ndarray, inline: bool) -> None:
        item = ticket._item
        inline = inline and self._inline_ok(item)
        with self._cond:
            if ticket._state != "reserved":
                return
            ticket._state = "submitted"
            if len(rows) != len(item.rows):  # NOTE: the rows admitted are the rows searched (the bound's count)
                self._outstanding -= len(item.rows) - len(rows)
            item.rows = rows
            closed = self._closed
            if closed:
                self._outstanding -= len(rows)
            elif inline and not self._pending and not self._searching:
                self._searching += 1
            else:
                self._pending.append(item)
                self._cond.notify()
                return
        if closed:
            call_soon(item.loop, _settle, item.future, None, ShuttingDown())
            return
        started = time.perf_counter()
        try:
            [(_, hits, error)] = self._search([item])
        finally:
            item.inline_s = time.perf_counter() - started
            with self._cond:
                self._outstanding -= len(rows)
                self._searching -= 1
        call_soon(item.loop, _settle, item.future, hits, error)

    def _inline_ok(self, item: _Pending) -> bool:
        """Whether ``item`` may be searched on the submitting thread: its version has a GPU copy that
        answers it (a bounded graph replay), so the engine thread is held a fraction of a millisecond;
        FAISS on the CPU and filters stay on the search thread."""
        return self._gpu_reader(item.index.reader, item.key) is not None

    def _gpu_reader(self, reader: Any, key: SearchKey) -> Any:
        """The GPU copy that answers ``key`` on ``reader``'s version (--search-device cuda; an IVF one probes
        the request's nprobe there too), or ``None``: FAISS answers (no copy, or a filter)."""
        return self.gpu.get(reader, key.nprobe) if self.gpu is not None and not key.where else None

    def _cancel(self, ticket: SearchTicket) -> None:
        with self._cond:
            if ticket._state == "reserved":
                ticket._state = "cancelled"
                self._outstanding -= len(ticket._item.rows)

    @property
    def outstanding(self) -> int:
        return self._outstanding

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # NOTE: never a silent dead thread: every later search would wait forever
            self._died(exc)

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                items = self._taken = list(self._pending)
                self._pending.clear()
                self._searching += 1
            fault("serve_search_batch")
            self._search_all(items)
            # NOTE: nothing of the last batch may stay referenced while the thread waits: its requests hold their
            # index version, whose memory and lease (a re-index may prune it) would stay until the next search
            self._taken = None
            del items

    def _died(self, error: BaseException) -> None:
        """(the search thread, ending) An unexpected error outside the per-search guards: every search taken or
        queued is answered ``ThreadStopped`` (500), later ones ``ShuttingDown``, and the server stops."""
        stopped = thread_died("search thread", error, self.on_death)
        with self._cond:
            self._closed = True
            left = [*(self._taken or ()), *self._pending]
            self._pending.clear()
            self._outstanding = 0
        self._taken = None
        for item in left:
            call_soon(item.loop, _settle, item.future, None, stopped)

    def _search_all(self, items: list[_Pending]) -> None:
        """Search ``items`` in as few calls as their keys allow and settle their futures (its locals end here)."""
        groups: dict[SearchKey, list[_Pending]] = {}
        for item in items:
            groups.setdefault(item.key, []).append(item)
        done: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]] = {}
        for group in groups.values():
            for part in _parts(group):
                for item, hits, error in self._search(part):
                    done.setdefault(item.loop, []).append((item.future, hits, error))
        with self._cond:
            self._outstanding -= sum(len(item.rows) for item in items)
            self._searching -= 1
        for loop, settled in done.items():  # one wake-up of the event loop per batch
            call_soon(loop, _settle_all, settled)

    def _search(self, group: list[_Pending]) -> list[tuple[_Pending, Any, BaseException | None]]:
        first = group[0]
        key, index = first.key, first.index
        try:
            rows = first.rows if len(group) == 1 else np.concatenate([item.rows for item in group])
            if key.model_vectors:  # the query path of `petal query`: model vectors -> the index-time transform
                rows = index.transform.stored(rows)
            found = self._search_rows(index, rows, key)
        except Exception as exc:  # a bad filter (FilterError: 422) or a bug (500): they fail, the thread lives
            return [(item, None, exc) for item in group]
        out: list[tuple[_Pending, Any, BaseException | None]] = []
        cursor = 0
        for item in group:
            out.append((item, found[cursor : cursor + len(item.rows)], None))
            cursor += len(item.rows)
        return out

    def _search_rows(self, index: SearchIndex, rows: np.ndarray, key: SearchKey) -> list[list[Hit]]:
        reader = index.reader
        if key.where:
            reader.selector(key.where)  # a bad expression or unknown column: FilterError naming it
        gpu = self._gpu_reader(reader, key)
        if gpu is not None:  # (only binary indexes rescore, and they have no GPU copy)
            return gpu.search(rows, key.k)
        if overrides(reader, key.nprobe, key.rescore):
            with self.params_lock.exclusive(), search_params(reader, key.nprobe, key.rescore):
                return reader.search(rows, key.k, where=key.where)
        with self.params_lock.shared():
            return reader.search(rows, key.k, where=key.where)


def _parts(group: list[_Pending]) -> list[list[_Pending]]:
    """``group`` in runs of at most ``MAX_BATCH_ROWS`` query rows (a request is never split)."""
    parts: list[list[_Pending]] = [[]]
    rows = 0
    for item in group:
        if parts[-1] and rows + len(item.rows) > MAX_BATCH_ROWS:
            parts.append([])
            rows = 0
        parts[-1].append(item)
        rows += len(item.rows)
    return parts
