"""Batching across requests: texts of every request queue first-come-first-served into token-budget
batches (the pipeline's ``Packer``), run by one engine thread.

```
event loop   embed(token ids) -> queue (bounded: Overloaded -> 503) -> await the request's future
engine thread  take what is queued (after --max-wait-ms unless the budget fills) -> Packer ->
               Engine.step -> LazyTensor; while step N runs the next batch is packed and launched,
               up to steps_in_flight; results go back to each request's rows
```

With ``max_wait_ms`` 0 a lone query launches at once; under load, the texts that arrive while a
step runs form the next batch, so batches grow with concurrency without anyone waiting on a timer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from petal.engine.engine import Engine
from petal.engine.lazy_tensor import LazyTensor
from petal.pipeline.ingest.pack import PackConfig, Packer
from petal.pipeline.serve.metrics import ServeMetrics


class Overloaded(Exception):
    """The queue holds ``max_queue_texts`` texts already: answer 503 with Retry-After."""


class _Job:
    """One request's texts: rows filled as their steps finish, then its future resolves."""

    __slots__ = ("future", "loop", "out", "remaining")

    def __init__(self, loop: asyncio.AbstractEventLoop, rows: int, dim: int) -> None:
        self.loop = loop
        self.future: asyncio.Future[np.ndarray] = loop.create_future()
        self.out = np.empty((rows, dim), dtype=np.float32)
        self.remaining = rows


class _Item:
    __slots__ = ("arrived", "job", "row", "token_ids")

    def __init__(self, job: _Job, row: int, token_ids: np.ndarray, arrived: float) -> None:
        self.job = job
        self.row = row
        self.token_ids = token_ids
        self.arrived = arrived


def _resolve(job: _Job, error: BaseException | None) -> None:
    if job.future.done():  # the client went away
        return
    if error is None:
        job.future.set_result(job.out)
    else:
        job.future.set_exception(error)


def _resolve_all(jobs: list[_Job]) -> None:
    for job in jobs:
        _resolve(job, None)


class TokenBatcher:
    """Queue texts of many requests into engine steps. ``start()`` the thread, ``close()`` drains it."""

    def __init__(self, engine: Engine, metrics: ServeMetrics, max_wait_ms: float = 0.0,
                 max_queue_texts: int = 4096) -> None:
        self.engine = engine
        self.metrics = metrics
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue_texts = max_queue_texts
        self.pack_config = PackConfig(engine.config.token_budget, engine.config.max_seqs)
        self._pending: deque[_Item] = deque()
        self._pending_tokens = 0
        self._outstanding = 0  # texts accepted and not answered yet (queued, packed or in a step)
        self._cond = threading.Condition()
        self._closed = False
        self._replays = engine.stats.graph_replays  # warm-up replays are not counted
        self._thread = threading.Thread(target=self._run, name="petal-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def outstanding(self) -> int:
        return self._outstanding

    async def embed(self, token_ids: list[np.ndarray]) -> np.ndarray:
        """``[len(token_ids), model_dim]`` model vectors; raises ``Overloaded`` when the queue is full."""
        job = _Job(asyncio.get_running_loop(), len(token_ids), self.engine.dim)
        if not token_ids:
            return job.out
        now = time.perf_counter()
        with self._cond:
            if self._closed:
                raise Overloaded("the server is shutting down")
            if self._outstanding + len(token_ids) > self.max_queue_texts:
                raise Overloaded(f"{self._outstanding} texts are queued (limit {self.max_queue_texts}, "
                                 "--max-queue-texts)")
            for row, ids in enumerate(token_ids):
                self._pending.append(_Item(job, row, ids, now))
                self._pending_tokens += len(ids)
            self._outstanding += len(token_ids)
            self.metrics.queue_texts.set(self._outstanding)
            self._cond.notify()
        return await job.future

    def close(self, timeout_s: float = 30.0) -> None:
        """Finish what is queued, then stop the engine thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # --- the engine thread ----------------------------------------------------------------------

    def _take(self, block: bool) -> list[_Item] | None:
        """What is queued, FCFS (``None``: closed and empty; ``[]``: nothing now and ``block`` false)."""
        with self._cond:
            while block and not self._pending and not self._closed:
                self._cond.wait()
            if not self._pending:
                return None if self._closed else []
            if self.max_wait_s > 0:
                deadline = self._pending[0].arrived + self.max_wait_s
                while self._pending_tokens < self.pack_config.token_budget and not self._closed:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            items = list(self._pending)
            self._pending.clear()
            self._pending_tokens = 0
            return items

    def _run(self) -> None:
        in_flight: deque[tuple[Any, LazyTensor, float]] = deque()
        depth = self.engine.config.steps_in_flight
        while True:
            items = self._take(block=not in_flight)
            if items is None:
                break
            packer = Packer(self.pack_config)
            for item in items:
                full = packer.add(item, item.token_ids)
                if full is not None:
                    self._launch(full, in_flight)
                    while len(in_flight) > depth:
                        self._deliver(*in_flight.popleft())
            last = packer.flush()
            if last is not None:
                self._launch(last, in_flight)
            # NOTE: with nothing new queued, read the oldest result now; otherwise keep up to `depth`
            # steps in flight so the device runs one while the host packs the next.
            while in_flight and (len(in_flight) > depth or not self._pending):
                self._deliver(*in_flight.popleft())
        while in_flight:
            self._deliver(*in_flight.popleft())

    def _launch(self, batch: Any, in_flight: deque[tuple[Any, LazyTensor, float]]) -> None:
        started = time.perf_counter()
        for item in batch.keys:
            self.metrics.queue_seconds.observe(started - item.arrived)
        self.metrics.batch_tokens.observe(batch.num_tokens)
        self.metrics.batch_texts.observe(batch.num_seqs)
        try:
            lazy = self.engine.step(batch)
        except Exception as exc:  # a bug or a device error: fail these requests, keep serving
            self._fail(batch.keys, exc)
            return
        replays = self.engine.stats.graph_replays
        if replays > self._replays:
            self.metrics.graph_replays.inc(replays - self._replays)
            self._replays = replays
        in_flight.append((batch.keys, lazy, started))

    def _deliver(self, items: Any, lazy: LazyTensor, started: float) -> None:
        try:
            rows = lazy.result()
        except Exception as exc:
            self._fail(items, exc)
            return
        self.metrics.step_seconds.observe(time.perf_counter() - started)
        done: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
        for i, item in enumerate(items):
            job = item.job
            job.out[item.row] = rows[i]
            job.remaining -= 1
            if job.remaining == 0:
                done.setdefault(job.loop, []).append(job)
        self._answered(len(items))
        for loop, jobs in done.items():  # NOTE: one wake-up of the event loop per step, not one per request
            loop.call_soon_threadsafe(_resolve_all, jobs)

    def _fail(self, items: Any, error: BaseException) -> None:
        for job in {id(item.job): item.job for item in items}.values():
            if job.remaining > 0:
                job.remaining = 0
                job.loop.call_soon_threadsafe(_resolve, job, error)
        self._answered(len(items))

    def _answered(self, count: int) -> None:
        with self._cond:
            self._outstanding -= count
            self.metrics.queue_texts.set(self._outstanding)
