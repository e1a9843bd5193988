"""Batching across requests: texts of every request queue first-come-first-served into token-budget
batches (the pipeline's ``Packer``), run by one engine thread, which also tokenizes them.

```
event loop   embed_texts(texts, side, truncate) or embed(token ids) -> queue (bounded: Overloaded -> 503)
             -> await the request's future
engine thread  take what is queued (after --max-wait-ms unless the budget fills) -> tokenize all its
               texts at once (one call per prompt side; Rust, GIL released) -> per-request limit
               errors (413/422 to that request only) -> Packer -> Engine.step -> LazyTensor; while
               step N runs the next batch is tokenized, packed and launched, up to steps_in_flight;
               results go back to each request's rows (one holding NaN or infinity: 422 to that request only)
```

The event loop does only HTTP, JSON, queueing and the answer's encoding: tokenizing on it cost 0.4-0.5 ms
of its CPU per 128-token request, which capped how many requests reached a step.

With ``max_wait_ms`` 0 a lone query launches at once; under load, the texts that arrive while a
step runs form the next batch, so batches grow with concurrency without anyone waiting on a timer.

With nothing queued, the engine thread spins for ``spin_ms`` (``os.sched_yield()``, the GIL released at each
turn) before it sleeps on the queue's condition: a thread woken from sleep launches its step on a cold core
(H200, pplx-embed-0.6b, woken through a Condition after a 2 ms gap: 925 / 1252 us asleep against 865 / 1188 us
spinning, 16 / 128 tokens; ``bench/idle_gap_probe.py``). The default spins 2 ms on CUDA and not at all on the
CPU, where the engine needs every core.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from petal.pipeline.ingest.pack import PackConfig, Packer
from petal.pipeline.ingest.tokens import Encoded, TextTokenizer
from petal.pipeline.reliability.errors import PetalError
from petal.pipeline.reliability.faults import fault
from petal.pipeline.serve.metrics import ServeMetrics
from petal.pipeline.serve.requests import RequestError, chars_message, limit_message

log = logging.getLogger("petal.serve")

if TYPE_CHECKING:  # NOTE: torch; the server of an index of precomputed vectors imports this module without it
    from petal.engine.engine import Engine
    from petal.engine.lazy_tensor import LazyTensor

CHARS_PER_TOKEN = 4  # a queued text's token estimate (for --max-wait-ms's budget) before it is tokenized
CUDA_SPIN_MS = 2.0  # the engine thread's spin before it sleeps, when the engine runs on CUDA (--engine-spin-ms)


def token_estimate(text: str) -> int:
    """A queued text's tokens before it is tokenized (for ``--max-wait-ms``'s budget): a token per 4 characters, or,
    where words are shorter, one per space, comma and period (each word and each mark is a token at least wherever
    the pre-tokenizer splits at spaces and punctuation).
    NOTE: characters alone counted ``"a " * 200`` (401 tokens) as 101: two such texts waited out ``--max-wait-ms``
    with the budget full. Still an estimate (CJK text, a token a character, counts a quarter): a budget it misses
    waits ``--max-wait-ms`` at most. ``str.count``: no copy, cheap on the event loop."""
    return max(len(text) // CHARS_PER_TOKEN, text.count(" ") + text.count(",") + text.count(".")) + 1


class Overloaded(Exception):
    """The queue holds ``max_queue_texts`` texts already: answer 503 with Retry-After."""


class ThreadStopped(PetalError):
    """A serving thread (the engine's, the search's) or the version follower ended on an unexpected error (a bug past
    every per-request guard). The requests waiting on it are answered 500 with this, and the server stops: the
    process exits 1 (so a supervisor starts a new one) instead of hanging every later request while ``/ready``
    still says ready."""

    def __init__(self, what: str, error: BaseException) -> None:
        super().__init__(f"internal error: the {what} stopped on {type(error).__name__}: {error}; the requests "
                         "waiting on it were answered 500 and the server stops (exit 1: a bug, its traceback is in "
                         "the log)")
        self.error = error


def thread_died(what: str, error: BaseException, on_death: Callable[[ThreadStopped], None]) -> ThreadStopped:
    """(the dying thread) Log ``error`` with its traceback, then tell the server (``on_death``); the error to answer
    the requests still waiting with."""
    stopped = ThreadStopped(what, error)
    log.error("petal serve: %s", stopped, exc_info=error)
    on_death(stopped)
    return stopped


class _Job:
    """One request's texts: rows filled as their steps finish, then its future resolves.

    ``side``/``truncate``/``name``: texts to tokenize on the engine thread (``name`` is the request's field,
    for limit messages); ``tokens`` and ``tokenize_s`` are known once they are tokenized."""

    __slots__ = ("cancelled", "estimate", "future", "loop", "name", "out", "remaining", "side", "then", "tokenize_s",
                 "tokens", "truncate")

    def __init__(self, loop: asyncio.AbstractEventLoop, rows: int, dim: int, side: str = "query",
                 truncate: bool = False, name: str = "input",
                 then: Callable[[np.ndarray, bool], None] | None = None) -> None:
        self.loop = loop
        self.future: asyncio.Future[np.ndarray] = loop.create_future()
        self.out = np.empty((rows, dim), dtype=np.float32)
        self.remaining = rows
        self.side = side
        self.truncate = truncate
        self.name = name
        self.tokens = 0
        self.tokenize_s = 0.0
        self.then = then  # called on the engine thread with the rows (and `lone`), before the future resolves
        self.estimate = 0  # its tokens as counted in the queue's budget (_queue)
        self.cancelled = False  # its request was cancelled (the client went away): not embedded unless launched


class _Item:
    __slots__ = ("arrived", "job", "row", "text", "token_ids")

    def __init__(self, job: _Job, row: int, token_ids: np.ndarray | None, arrived: float,
                 text: str = "") -> None:
        self.job = job
        self.row = row
        self.token_ids = token_ids  # None: ``text`` is tokenized on the engine thread
        self.text = text
        self.arrived = arrived


@dataclass(frozen=True)
class Embedded:
    """A request's model vectors, its token count (usage) and the engine thread's tokenize time."""

    rows: np.ndarray
    tokens: int
    tokenize_s: float


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


def call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` on ``loop``, from another thread. NOTE: nothing happens once the loop is closed (the
    server stopped): the request it would answer is gone, and a thread must not die of it."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


def non_finite_refusal(job: _Job) -> RequestError | None:
    """The 422 of a request whose model vectors hold NaN or infinity (an overflow inside a model whose weights are
    finite), naming its first such item, else ``None``: petal's rule for such a text (``petal query`` refuses it,
    ``petal embed`` and ``petal index`` skip it as ``non_finite_embedding``); never a ``null`` row, NaN base64 or a
    search on NaN."""
    finite = np.isfinite(job.out).all(axis=1)
    if finite.all():
        return None
    row = int(np.argmin(finite))
    return RequestError(422, f"{job.name} item {row} embeds to NaN or infinite values with this model (an overflow "
                             "inside the model): it cannot be embedded or searched (non_finite_embedding)")


SHUTTING_DOWN = "the server is shutting down"


class ShuttingDown(Overloaded):
    """The server stopped its threads (after draining): what was still queued or arrives now is cut off."""

    def __init__(self) -> None:
        super().__init__(SHUTTING_DOWN)


class TokenBatcher:
    """Queue texts of many requests into engine steps. ``start()`` the thread, ``close()`` drains it."""

    def __init__(self, engine: Engine, metrics: ServeMetrics, max_wait_ms: float = 0.0,
                 max_queue_texts: int = 4096, tokenizers: dict[str, TextTokenizer] | None = None,
                 spin_ms: float | None = None) -> None:
        self.engine = engine
        self.tokenizers = tokenizers or {}  # by prompt side, for embed_texts
        self.metrics = metrics
        self.max_wait_s = max_wait_ms / 1000.0
        if spin_ms is None:
            spin_ms = CUDA_SPIN_MS if str(engine.config.device).startswith("cuda") else 0.0
        if spin_ms < 0:
            raise ValueError(f"--engine-spin-ms {spin_ms} < 0")
        self.spin_s = spin_ms / 1000.0
        self.max_queue_texts = max_queue_texts
        self.pack_config = PackConfig(engine.config.token_budget, engine.config.max_seqs)
        self._pending: deque[_Item] = deque()
        self._pending_tokens = 0
        self._outstanding = 0  # texts accepted and not answered yet (queued, packed or in a step)
        self._cond = threading.Condition()
        self._closed = False
        self._in_flight: deque[tuple[Any, LazyTensor, float]] = deque()  # launched steps (engine thread)
        self._replays = engine.stats.graph_replays  # warm-up replays are not counted
        self._taken: list[_Item] | None = None  # what the engine thread took off the queue and works on now
        # set by the server: this thread ended on an unexpected error (the server stops)
        self.on_death: Callable[[ThreadStopped], None] = lambda stopped: None
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
        self._queue(job, [_Item(job, row, ids, now) for row, ids in enumerate(token_ids)],
                    sum(len(ids) for ids in token_ids))
        return await self._answer(job)

    async def embed_texts(self, texts: tuple[str, ...] | list[str], side: str, truncate: bool,
                          name: str = "input", then: Callable[[np.ndarray, bool], None] | None = None) -> Embedded:
        """Model vectors of ``texts``, tokenized with ``side``'s prompt on the engine thread. ``RequestError``
        413 for a text over the tokens-per-text limit without ``truncate``, 422 for one without tokens
        or one the model embeds to NaN or infinity (naming the request's field ``name`` and the item);
        ``Overloaded`` when the queue is full.

        ``then(rows, lone)``: called on the engine thread as soon as all the rows are read, before the event
        loop hears of them (``/search`` queues its search from there); not called when the request fails.
        ``lone``: the step held only this request and nothing else waits for the engine thread, so a short
        continuation may do its work right there (a lone ``/search`` on a GPU copy); otherwise it must not
        block. If it raises, the request fails with that error."""
        job = _Job(asyncio.get_running_loop(), len(texts), self.engine.dim, side, truncate, name, then)
        if not texts:
            return Embedded(job.out, 0, 0.0)
        if side not in self.tokenizers:
            raise ValueError(f"no tokenizer for side {side!r}")
        now = time.perf_counter()
        self._queue(job, [_Item(job, row, None, now, text) for row, text in enumerate(texts)],
                    sum(token_estimate(t) for t in texts))
        rows = await self._answer(job)
        return Embedded(rows, job.tokens, job.tokenize_s)

    async def _answer(self, job: _Job) -> np.ndarray:
        """``job``'s rows; a cancelled wait (its client closed the connection) withdraws it (``_withdraw``)."""
        try:
            return await job.future
        except asyncio.CancelledError:
            self._withdraw(job)
            raise

    def _withdraw(self, job: _Job) -> None:
        """(event loop) ``job``'s request was cancelled: its texts leave the queue (their place in
        ``--max-queue-texts`` given back) if the engine thread has not taken them yet; taken, they are skipped unless
        their step is launched already (that step runs, its rows are dropped)."""
        job.cancelled = True  # NOTE: read by the engine thread without the lock: at worst it embeds the texts
        with self._cond:
            kept = [item for item in self._pending if item.job is not job]
            removed = len(self._pending) - len(kept)
            if not removed:  # NOTE: a job's texts are queued and taken together: all of them are here, or none
                return
            self._pending.clear()
            self._pending.extend(kept)
            self._pending_tokens -= job.estimate
            self._outstanding -= removed
            self.metrics.queue_texts.set(self._outstanding)
            self._cond.notify()  # a partial batch held for --max-wait-ms may be empty now

    def _queue(self, job: _Job, items: list[_Item], tokens: int) -> None:
        job.estimate = tokens
        with self._cond:
            if self._closed:
                raise ShuttingDown()
            if self._outstanding + len(items) > self.max_queue_texts:
                raise Overloaded(f"{self._outstanding} texts are queued (limit {self.max_queue_texts}, "
                                 "--max-queue-texts)")
            self._pending.extend(items)
            self._pending_tokens += tokens
            self._outstanding += len(items)
            self.metrics.queue_texts.set(self._outstanding)
            self._cond.notify()

    def close(self, timeout_s: float = 30.0) -> bool:
        """Stop the engine thread: texts still queued are answered ``ShuttingDown`` (503), the step running
        finishes. True once the thread has ended (waits up to ``timeout_s``).

        The server closes it after draining: every request has been answered by then, or was cut off at
        --drain-timeout-s, so what is still queued has nobody waiting for it."""
        with self._cond:
            self._closed = True
            dropped = list(self._pending)
            self._pending.clear()
            self._pending_tokens = 0
            self._cond.notify()
        if dropped:
            self._fail(dropped, ShuttingDown())
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # --- the engine thread ----------------------------------------------------------------------

    def _spin(self) -> None:
        """Up to ``spin_s`` of polling the queue before ``_take`` sleeps (module docstring).
        NOTE: racy reads of ``_pending``/``_closed`` (no lock): ``_take`` reads them again under it."""
        until = time.perf_counter() + self.spin_s
        while not self._pending and not self._closed and time.perf_counter() < until:
            os.sched_yield()  # NOTE: releases the GIL: the event loop queues the request meanwhile

    def _take(self, block: bool) -> list[_Item] | None:
        """What is queued, FCFS (``None``: closed and empty; ``[]``: nothing now and ``block`` false)."""
        if block and self.spin_s > 0 and not self._pending:
            self._spin()
        with self._cond:
            while block and not self._pending and not self._closed:
                self._cond.wait()
            if not self._pending:
                return None if self._closed else []
            if self.max_wait_s > 0:
                # NOTE: the oldest text's deadline, read again after each wake-up: a request withdrawn meanwhile
                # (_withdraw) may have left another one first, or nothing to wait for
                while self._pending and self._pending_tokens < self.pack_config.token_budget and not self._closed:
                    left = self._pending[0].arrived + self.max_wait_s - time.perf_counter()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            items = list(self._pending)
            self._pending.clear()
            self._pending_tokens = 0
            return items

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # NOTE: never a silent dead thread: every later request would wait forever
            self._died(exc)

    def _serve(self) -> None:
        in_flight = self._in_flight
        depth = self.engine.config.steps_in_flight
        while True:
            items = self._take(block=not in_flight)
            if items is None:
                break
            self._taken = items
            if items:
                fault("serve_engine_batch")
            self._pack(items, in_flight, depth)
            # NOTE: nothing of the last requests may stay referenced while _take sleeps: a job's continuation holds
            # its search ticket and so the index version it searches, whose memory and lease (a re-index may prune
            # it) would stay until the next request after a swap
            self._taken = None
            del items
        while in_flight:
            self._deliver(*in_flight.popleft())

    def _died(self, error: BaseException) -> None:
        """(the engine thread, ending) An unexpected error outside the per-request guards: every text taken, queued
        or in a step is answered ``ThreadStopped`` (500), later ones ``ShuttingDown``, and the server stops."""
        stopped = thread_died("engine thread", error, self.on_death)
        with self._cond:
            self._closed = True
            left = [*(self._taken or ()), *self._pending]
            left += [item for keys, _, _ in self._in_flight for item in keys]
            self._pending.clear()
            self._pending_tokens = 0
            self._in_flight.clear()
        self._taken = None
        self._fail(left, stopped)
        with self._cond:  # NOTE: what was taken may hold texts answered already: nothing is outstanding now
            self._outstanding = 0
            self.metrics.queue_texts.set(0)

    def _pack(self, items: list[_Item], in_flight: deque[tuple[Any, LazyTensor, float]], depth: int) -> None:
        """Tokenize ``items``, pack and launch their steps, and deliver what is due (its locals end here)."""
        items = self._tokenize(self._live(items))
        packer = Packer(self.pack_config)
        for done, item in enumerate(items):
            if self._closed:  # NOTE: shutting down: what is not launched yet has nobody waiting for it
                held = packer.flush()
                self._fail([*(held.keys if held is not None else ()), *items[done:]], ShuttingDown())
                break
            assert item.token_ids is not None  # tokenized above
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

    def _live(self, items: list[_Item]) -> list[_Item]:
        """``items`` less those of requests cancelled since they were queued (``_withdraw``: the client went away),
        whose place in the queue is given back."""
        if not any(item.job.cancelled for item in items):
            return items
        live = [item for item in items if not item.job.cancelled]
        self._answered(len(items) - len(live))
        return live

    def _tokenize(self, items: list[_Item]) -> list[_Item]:
        """Token ids for the texts among ``items`` (one tokenizer call per side); the requests refused by a
        limit (or whose tokenization failed) are answered with their error and their items left out."""
        by_side: dict[str, list[_Item]] = {}
        for item in items:
            if item.token_ids is None:
                by_side.setdefault(item.job.side, []).append(item)
        if not by_side:
            return items
        refused: set[int] = set()
        for side, todo in by_side.items():
            tokenizer = self.tokenizers[side]
            started = time.perf_counter()
            try:
                encoded = tokenizer.encode([item.text for item in todo])
            except Exception:  # NOTE: one request's text must not fail the others of the batch
                todo, encoded = self._tokenize_apart(tokenizer, todo, refused)
                if not todo:
                    continue
            elapsed = time.perf_counter() - started
            # NOTE: a request's texts are queued and taken together: its checks see all of them, in row order
            # a request answers its first refusal: a text over the limit (413) before one without tokens (422)
            errors: dict[int, tuple[int, int, str]] = {}  # id(job) -> (status, row, message), the least
            jobs: dict[int, list[_Item]] = {}
            over_chars = encoded.over_chars if encoded.over_chars is not None else np.zeros(len(todo), dtype=bool)
            for item, ids, cut, long in zip(todo, encoded.token_ids, encoded.truncated, over_chars):
                job = item.job
                item.token_ids = ids
                job.tokens += len(ids)
                job.tokenize_s = elapsed
                jobs.setdefault(id(job), []).append(item)
                refusal = None
                if cut and not job.truncate:  # NOTE: cut at the characters petal reads, not at the token limit
                    refusal = (413, item.row, chars_message(job.name, item.row, len(item.text),
                                                            tokenizer.max_text_chars,
                                                            len(ids) == 0 or tokenizer.sees_nothing(ids)) if long else
                               limit_message(job.name, item.row, tokenizer.max_length))
                elif len(ids) == 0:
                    refusal = (422, item.row, f"{job.name} item {item.row} yields no tokens")
                elif tokenizer.sees_nothing(ids):  # NOTE: an empty text's ids: petal index's empty_text, as blank
                    refusal = (422, item.row, f"{job.name} item {item.row} is empty to the model: its tokenizer "
                                              "drops every character of it (empty_text)")
                if refusal is not None:
                    errors[id(job)] = min(errors.get(id(job), refusal), refusal)
            for key, (status, _, message) in errors.items():
                refused.add(key)
                self._fail(jobs[key], RequestError(status, message))
        if not refused:
            return items
        return [item for item in items if id(item.job) not in refused]

    def _tokenize_apart(self, tokenizer: TextTokenizer, todo: list[_Item],
                        refused: set[int]) -> tuple[list[_Item], Encoded]:
        """``todo`` tokenized one request at a time, after a call for all of them failed: the requests whose
        texts fail (a bug: 500) are answered with their error and left out."""
        jobs: dict[int, list[_Item]] = {}
        for item in todo:
            jobs.setdefault(id(item.job), []).append(item)
        kept: list[_Item] = []
        token_ids: list[np.ndarray] = []
        truncated: list[bool] = []
        over_chars: list[bool] = []
        for key, items in jobs.items():
            try:
                encoded = tokenizer.encode([item.text for item in items])
            except Exception as exc:
                refused.add(key)
                self._fail(items, exc)
                continue
            kept.extend(items)
            token_ids.extend(encoded.token_ids)
            truncated.extend(encoded.truncated)
            over_chars.extend(encoded.over_chars if encoded.over_chars is not None else [False] * len(items))
        return kept, Encoded(token_ids, np.asarray(truncated, dtype=bool), np.asarray(over_chars, dtype=bool))

    def _launch(self, batch: Any, in_flight: deque[tuple[Any, LazyTensor, float]]) -> None:
        started = time.perf_counter()
        try:
            lazy = self.engine.step(batch)
        except Exception as exc:  # a bug or a device error: fail these requests, keep serving
            self._observe_batch(batch, started)
            self._fail(batch.keys, exc)
            return
        # NOTE: recorded after the launch: on CUDA the device runs the step meanwhile (a lone query's step
        # does not wait for them)
        self._observe_batch(batch, started)
        replays = self.engine.stats.graph_replays
        if replays > self._replays:
            self.metrics.graph_replays.inc(replays - self._replays)
            self._replays = replays
        in_flight.append((batch.keys, lazy, started))

    def _observe_batch(self, batch: Any, started: float) -> None:
        for item in batch.keys:
            self.metrics.queue_seconds.observe(started - item.arrived)
        self.metrics.batch_tokens.observe(batch.num_tokens)
        self.metrics.batch_texts.observe(batch.num_seqs)

    def _deliver(self, items: Any, lazy: LazyTensor, started: float) -> None:
        try:
            rows = lazy.result()
        except Exception as exc:
            self._fail(items, exc)
            return
        step_s = time.perf_counter() - started
        done: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
        for i, item in enumerate(items):
            job = item.job
            job.out[item.row] = rows[i]
            job.remaining -= 1
            if job.remaining == 0:
                refusal = non_finite_refusal(job)
                if refusal is not None:  # NOTE: this request only: the others of the step are answered
                    call_soon(job.loop, _resolve, job, refusal)
                    continue
                if job.then is not None and not job.cancelled:  # (a cancelled /search gave its search place back)
                    # NOTE: a racy read of the queue is enough: a request queued just after waits one short
                    # continuation at most. A request's texts are queued together and packed in order, so a step
                    # holding as many items as this request has rows, first and last its own, holds only it
                    lone = not self._in_flight and not self._pending and items[0].job is job \
                        and items[-1].job is job and len(items) == len(job.out)
                    try:
                        job.then(job.out, lone)
                    except Exception as exc:  # NOTE: a bug in the continuation fails its request only
                        call_soon(job.loop, _resolve, job, exc)
                        continue
                done.setdefault(job.loop, []).append(job)
        # NOTE: answered texts leave the queue's count before their clients can hear (and send again)
        self._answered(len(items))
        for loop, jobs in done.items():  # NOTE: one wake-up of the event loop per step, not one per request
            call_soon(loop, _resolve_all, jobs)
        self.metrics.step_seconds.observe(step_s)  # after the wake-ups, off the answers' path

    def _fail(self, items: Any, error: BaseException) -> None:
        for job in {id(item.job): item.job for item in items}.values():
            if job.remaining > 0:
                job.remaining = 0
                call_soon(job.loop, _resolve, job, error)
        self._answered(len(items))

    def _answered(self, count: int) -> None:
        with self._cond:
            self._outstanding -= count
            self.metrics.queue_texts.set(self._outstanding)
