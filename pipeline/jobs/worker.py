"""One embedding worker process of ``petal index --devices/--workers`` (started by ``pipeline/jobs/workers.py``).

A worker owns one device: it loads its own engine, claims shards from the coordinator one at a time as
its tokenizer asks for more input (the read-ahead of a few record batches bounds how far ahead it
claims, so a slow shard never holds back work another worker could take), reads and tokenizes
them itself, and commits each shard to the store exactly as the single-process run does
(``embed_shards``). It talks to the coordinator over its own pipe (no lock shared between workers:
a worker killed at any instant cannot block the others):

    ("claim", worker)                                 -> the coordinator answers a unit, or None: stop

    ("ready", worker, pid, engine description)     engine loaded
    ("rows", worker, n)                              n more documents handed to the device (progress)
    ("commit", worker, unit, entry path)             a unit committed: a shard's store entry, or a range's part
    ("done", worker, summary)                        no more work: every claimed shard committed
    ("summary", worker, summary)                     what it committed before it stopped: sent before its "error"
    ("error", worker, exit code, status, message)    stopped by a PetalError (or a bug: exit 1)

A worker whose coordinator is gone (killed with SIGKILL, or by a second SIGTERM, or crashed) has no one to
report to and nothing left to do: it ends at once, quietly (no traceback), with exit ``ORPHANED_EXIT``,
as if killed. It notices at its next word on the pipe (a broken pipe, an EOF) or, sooner, by its parent's
pid (a watchdog thread, every ``PARENT_POLL_S``: a long shard or a model load sends nothing for a while).
The store stays consistent as after a SIGKILL: every entry is committed by one rename, so the units
committed before stay (a rerun reuses them) and the one being embedded is not committed (its ``tmp/``
files go at the next run).

NOTE: this module is imported in the spawned child before ``CUDA_VISIBLE_DEVICES`` takes effect
for torch, so it (and what it imports at the top) must never import torch.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from petal.pipeline.config import IndexJob
from petal.pipeline.ingest.parquet import ReadStats, ShardInfo
from petal.pipeline.store.embeddings import DamagedEntry, EmbeddingStore, StoreEntry, shard_key
from petal.pipeline.store.ranges import part_dir

PROGRESS_EVERY_S = 0.25
UNITS_AHEAD = 2  # units a worker holds claimed that its embed loop has not finished taking: the one it embeds, the next
PARENT_POLL_S = 0.2  # how often a worker checks that its coordinator is alive
ORPHANED_EXIT = 75  # a worker whose coordinator is gone (no one reads it: a temporary failure, as a killed worker)


@dataclass(frozen=True)
class WorkerPlan:
    """What every worker needs (pickled once per worker): the run's settings and the shards to embed."""

    job: IndexJob
    spec: Any  # ModelSpec (hashes already computed: workers never re-hash the weights)
    config: Any  # EngineConfig; the device is the worker's own (cuda = its one visible GPU)
    transform: Any  # OutputTransform
    engine_factory: Callable[..., Any]  # picklable: the Engine class, or a test's partial
    settings: dict[str, Any]
    store_root: Path
    shards: list[ShardInfo]
    fingerprints: list[str]
    sha256: list[str]  # each shard's content hash (the coordinator computed it; never read twice)
    ranges: list[Any]  # the units handed out (``RowRange``: a whole shard, or a row-group range of a large one)


@dataclass(frozen=True)
class WorkerSlot:
    """One worker: its number, the CUDA device it sees (``None``: the CPU) and its CPU thread share."""

    index: int
    cuda_device: str | None
    torch_threads: int | None

    @property
    def label(self) -> str:
        return f"cuda:{self.cuda_device}" if self.cuda_device is not None else "cpu"


class CoordinatorGone(Exception):
    """The coordinator's end of the pipe is closed: it died (or ended) while this worker ran."""


class Channel:
    """The worker's end of its pipe: events from any thread, claims from the reading thread. A pipe the
    coordinator no longer holds (broken pipe, reset, EOF) raises ``CoordinatorGone`` and sets ``gone``."""

    def __init__(self, conn: Any, worker: int) -> None:
        self._conn = conn
        self._worker = worker
        self._lock = threading.Lock()
        self.gone = False

    def put(self, event: tuple[Any, ...]) -> None:
        with self._lock, self._pipe():
            self._conn.send(event)

    def claim(self, closing: threading.Event) -> int | None:
        """The next shard position to embed, or ``None`` (no more work, or stop)."""
        self.put(("claim", self._worker))
        with self._pipe():
            while not self._conn.poll(0.1):
                if closing.is_set():
                    return None
            position: int | None = self._conn.recv()
        return position

    @contextlib.contextmanager
    def _pipe(self) -> Iterator[None]:
        try:
            yield
        except (EOFError, OSError) as exc:  # BrokenPipeError, ConnectionResetError, a closed handle
            self.gone = True
            raise CoordinatorGone(f"the coordinator is gone ({exc!r})") from None


def exit_orphaned() -> None:
    """End this worker now, quietly: its coordinator is gone. As a SIGKILL would (the store's commits are
    single renames): no traceback, no atexit or finalizers (they would report to no one)."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(ORPHANED_EXIT)


def watch_parent(parent: int) -> threading.Thread:
    """A daemon thread that ends the process (``exit_orphaned``) once its parent ``parent`` is gone: this
    process is then re-parented, ``os.getppid()`` changes. ``parent``: ``os.getppid()`` at the worker's start
    (a parent already gone by then shows at the first check)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        exit_orphaned()

    thread = threading.Thread(target=watch, name="petal-worker-parent-watch", daemon=True)
    thread.start()
    return thread


def take_stop_signals() -> None:
    """A worker's stop signals, blocked since its spawn (``workers._stop_signals_held``), are its own from here on:
    until its run takes them (``StopSignals``), one ends it quietly with 128 + its number, as the coordinator
    expects of a worker still starting (``petal._startup``: no traceback, no line; the coordinator says it once).
    A signal that came while it was blocked (a Ctrl-C to the process group, the one the coordinator passed on) is
    acted on now."""
    import signal

    from petal._startup import quiet_signals

    quiet_signals()
    if hasattr(signal, "pthread_sigmask"):
        from petal.pipeline.reliability.signals import STOP_SIGNALS

        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def worker_main(plan: WorkerPlan, slot: WorkerSlot, conn: Any, coordinator: int | None = None) -> None:
    """The child's entry point: embed claimed shards until the queue is empty or the coordinator says stop.
    ``coordinator``: the pid of the process that started it (the parent watched; default: this one's parent
    now, which misses a coordinator that died before this line)."""
    take_stop_signals()
    if slot.cuda_device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = slot.cuda_device  # NOTE: before the first torch import
    from tqdm import tqdm

    from petal.pipeline.reliability.errors import unmapped_error
    from petal.pipeline.reliability.faults import fault
    from petal.pipeline.reliability.signals import StopSignals

    fault("worker_start")  # NOTE: a sleep here is a worker still starting when a stop signal comes

    # NOTE: tqdm's default lock is a multiprocessing semaphore, registered with the coordinator's resource
    # tracker; a killed worker would leave it behind (a warning at exit). A worker's bars are disabled anyway.
    tqdm.set_lock(threading.RLock())
    watch_parent(coordinator if coordinator is not None else os.getppid())
    events = Channel(conn, slot.index)
    tally = WorkerTally(slot)
    try:
        with StopSignals(second="stop") as stop:  # the coordinator forwards signals: a repeat must not kill
            try:
                _run(plan, slot, events, stop, tally)
            except BaseException as exc:
                if events.gone:  # NOTE: whatever the pipe's failure became on its way up (a thread, a wrapper)
                    exit_orphaned()
                # as the CLI maps it in one process: a disk's OSError 74, a model's error 78, ...
                error = unmapped_error(exc, [plan.store_root.parent])
                events.put(("summary", slot.index, tally.summary()))  # what it committed: the report counts it
                if error is not None:
                    events.put(("error", slot.index, error.exit_code, error.status, str(error)))
                    return
                traceback.print_exc(file=sys.stderr)  # a bug: the traceback goes to stderr, the coordinator exits 1
                events.put(("error", slot.index, 1, "failed", f"internal error in worker {slot.index}: {exc!r}"))
                return
        events.put(("done", slot.index, tally.summary()))
    except CoordinatorGone:  # the last word (error, done) had no one to read it
        exit_orphaned()


def no_commits() -> dict[str, int]:
    """A worker's commit counts before its first: units (whole shards, ranges), their rows and their rows' tokens."""
    return {"shards": 0, "ranges": 0, "rows": 0, "tokens": 0}


def count_commit(counts: dict[str, int], whole: bool, entry: StoreEntry) -> None:
    """One committed unit (a shard's entry, ``whole``, or a range's part) added to ``counts`` (``no_commits``): the
    worker's own tally, and the coordinator's of each worker (a worker that dies sends no summary)."""
    counts["shards" if whole else "ranges"] += 1
    counts["rows"] += entry.num_embedded
    counts["tokens"] += entry.num_tokens


class WorkerTally:
    """What a worker has done so far, its ``summary()`` the report's ``workers`` entry (less its ``status``): complete
    at its end, and what it committed when it stops early (a signal, an error)."""

    def __init__(self, slot: WorkerSlot) -> None:
        self.started = time.perf_counter()
        self.head: dict[str, Any] = {"worker": slot.index, "pid": os.getpid(), "device": slot.label}
        self.counts = no_commits()
        self.load_s: float | None = None
        self.report: Any = None  # the worker's RunReport (waits, OOM splits)
        self.stats: ReadStats | None = None
        self.engine: Any = None

    def summary(self) -> dict[str, Any]:
        summary = {**self.head, **self.counts}
        if self.stats is not None:
            summary["read_retries"] = self.stats.retries
        if self.load_s is not None and self.report is not None:
            timings = self.report.timings_s
            summary["timings_s"] = {"start": round(self.load_s, 3),
                                    "total": round(time.perf_counter() - self.started, 3),
                                    "embed_wait_tokens": timings.get("embed_wait_tokens", 0.0),
                                    "embed_wait_device": timings.get("embed_wait_device", 0.0)}
        if self.engine is not None:
            summary["engine"], summary["stats"] = self.engine.describe(), self.engine.stats.as_dict()
        if self.report is not None:
            summary["oom_splits"] = self.report.retries["oom_splits"]
        return summary


def _run(plan: WorkerPlan, slot: WorkerSlot, events: Channel, stop: Any, tally: WorkerTally) -> None:
    started = tally.started
    # NOTE: the start-up (the imports, torch's among them, the tokenizer, the engine's load: seconds to minutes, no
    # batch boundary in it) runs inside ``interruptible``: a stop signal ends it at once (``Interrupted``: the worker
    # reports itself interrupted and ends). Before, the signal was only noted, the load went on to its end, and the
    # coordinator waited ``SHUTDOWN_GRACE_S`` (30 s) for the worker, then killed it as lost.
    with stop.interruptible():
        from petal.pipeline.ingest.prefetch import Prefetcher
        from petal.pipeline.ingest.tokens import tokenize_documents, tokenizer_for
        from petal.pipeline.jobs.index_run import embed_shards
        from petal.pipeline.jobs.report import RunReport
        from petal.pipeline.store.embeddings import EmbeddingStore

        if slot.torch_threads is not None:
            import torch

            torch.set_num_threads(slot.torch_threads)
        store = EmbeddingStore(plan.store_root)  # NOTE: never ``open()``: that empties tmp/, where others write
        if plan.job.full:
            store.join_full_run()  # its commits are the --full run's (resumed after a stop)
        store.remember_sha256(plan.shards, plan.sha256)
        tokenizer = tokenizer_for(plan.spec)
    report = tally.report = RunReport(command="index-worker")
    closing = threading.Event()
    stats = tally.stats = ReadStats()
    ahead = ReadAhead(UNITS_AHEAD)
    documents = claimed_documents(plan, events, closing, stats, ahead)
    chunks = Prefetcher(tokenize_documents(documents, tokenizer, plan.job.tokenize_workers or 1), depth=16)
    try:
        with stop.interruptible():  # NOTE: inside the try: the reading threads started above are closed
            engine = tally.engine = load_engine(plan)
        progress = ProgressEngine(engine, events, slot.index)
        events.put(("ready", slot.index, os.getpid(), engine.describe()))
        tally.load_s = time.perf_counter() - started
        job = replace(plan.job, quiet=True)
        # the sink stores plan.transform.stored() vectors (the output transform is applied at the store)
        with contextlib.closing(embed_shards(ahead.taken(chunks), plan.shards, plan.fingerprints, store, plan.settings,
                                             progress, plan.transform, job, report, stop, None,
                                             plan.ranges)) as commits:
            for unit, entry in commits:
                progress.flush()
                events.put(("commit", slot.index, unit, str(entry.path)))
                count_commit(tally.counts, plan.ranges[unit].whole, entry)
        progress.flush()
    finally:
        closing.set()
        chunks.close()


def load_engine(plan: WorkerPlan) -> Any:
    """The worker's (or Ray actor's) engine, its errors as the run's in one process: a model's error (weights gone or
    wrong) is a ``ConfigError`` (78), a device or kernel the flags asked for and this host lacks a ``FlagError`` (2),
    a device that cannot go on a ``TemporaryFailure`` (75)."""
    from petal.pipeline.jobs.index_run import _reraise
    from petal.pipeline.reliability.errors import flag_errors
    from petal.pipeline.reliability.faults import fault

    try:
        with flag_errors():
            engine = plan.engine_factory(plan.spec, plan.config)
        fault("after_model_load")  # NOTE: a sleep here is a load that hangs (the coordinator's start timeout)
    except BaseException as exc:
        _reraise(exc)
    return engine


def unit_entry_path(plan: WorkerPlan, store: EmbeddingStore, unit: int) -> Path:
    """Where ``unit``'s committed entry (a whole shard's, or a range part's) lives in the store."""
    part = plan.ranges[unit]
    info, fingerprint = plan.shards[part.position], plan.fingerprints[part.position]
    path: Path = store.shards_dir / shard_key(info) / fingerprint if part.whole else \
        part_dir(store, info, fingerprint, part)
    return path


def entry_written_since(plan: WorkerPlan, store: EmbeddingStore, unit: int, since: float) -> StoreEntry | None:
    """``unit``'s entry if one is in the store, readable, with its ``entry.json`` written at or after ``since``
    (``time.time()``); else ``None``. A worker or actor that dies (or fails) between the entry's rename and
    its report leaves exactly such an entry; an older one (an earlier run's, as ``--full`` replaces) is not."""
    path = unit_entry_path(plan, store, unit)
    try:
        if (path / "entry.json").stat().st_mtime < since:
            return None
        return store.read_entry(path)
    except (OSError, DamagedEntry):
        return None


class ReadAhead:
    """How far a worker claims ahead of its embed loop, in units (not in chunks: the tokenized read-ahead is 16
    chunks deep, which is every unit of a small corpus, all claimed by the first worker to start while the
    others still load their engines).

    A unit is claimed only while fewer than ``units`` claimed ones have not been taken whole (their ``final``
    chunk) by the embed loop, or while the embed loop waits on an empty read-ahead (so the tokenizer's own
    window, which holds chunks until its source yields, can never wait on the loop that waits on it)."""

    def __init__(self, units: int) -> None:
        self.units = units
        self._changed = threading.Condition()
        self._claimed = 0
        self._taken = 0
        self._starving = False

    def wait_turn(self, closing: threading.Event) -> None:
        with self._changed:
            while self._claimed - self._taken >= self.units and not self._starving and not closing.is_set():
                self._changed.wait(0.1)
            self._claimed += 1

    def taken(self, chunks: Any) -> Any:
        """``chunks`` (a ``Prefetcher`` of tokenized units), counting each unit the consumer has taken whole: an
        iterator with ``close()``, as ``embed_shards`` takes."""
        return self._taken_from(chunks)

    def _taken_from(self, chunks: Any) -> Iterator[Any]:
        while True:
            starving = chunks.empty
            if starving:
                with self._changed:
                    self._starving = True
                    self._changed.notify_all()
            try:
                chunk = next(chunks, None)
            finally:
                if starving:
                    with self._changed:
                        self._starving = False
            if chunk is None:
                return
            if chunk.final:
                with self._changed:
                    self._taken += 1
                    self._changed.notify_all()
            yield chunk


def claimed_documents(plan: WorkerPlan, events: Any, closing: threading.Event,
                      stats: ReadStats, ahead: ReadAhead | None = None) -> Iterator[Any]:
    """The checked rows of every unit (a shard, or a row-group range of one) this worker claims, unit by unit
    (``Documents`` numbered by unit, ``final`` last).

    A unit is claimed when the previous one is read and, with ``ahead``, when the embed loop has taken all
    but ``ahead.units`` of those claimed before. The coordinator's ``None`` (nothing left, or stop) ends the
    claiming.

    NOTE: never wait for a commit before claiming: the packer holds a shard's last rows until the
    next shard's rows fill its batch, so that wait would never end.
    """
    from petal.pipeline.ingest.documents import range_documents

    while True:
        if ahead is not None:
            ahead.wait_turn(closing)
        unit = events.claim(closing)
        if unit is None:
            return
        part = plan.ranges[unit]
        yield from range_documents(unit, plan.shards[part.position], part, plan.job.read, stats)


class ProgressEngine:
    """The worker's engine, counting the documents of each step for the coordinator's progress bar."""

    def __init__(self, engine: Any, events: Channel, worker: int) -> None:
        self._engine = engine
        self._events = events
        self._worker = worker
        self._pending = 0
        self._sent_at = time.monotonic()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def step(self, batch: Any) -> Any:
        result = self._engine.step(batch)
        self._pending += batch.num_seqs
        if time.monotonic() - self._sent_at >= PROGRESS_EVERY_S:
            self.flush()
        return result

    def flush(self) -> None:
        if self._pending:
            self._events.put(("rows", self._worker, self._pending))
            self._pending = 0
        self._sent_at = time.monotonic()
