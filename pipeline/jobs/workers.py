"""The embed phase through worker processes: ``petal index --devices all|0,1|N`` and ``--workers N``.

The coordinator (the CLI process, holding the writer lock) starts one worker per device
(``multiprocessing`` with ``spawn``: each child sees only its GPU through ``CUDA_VISIBLE_DEVICES``),
queues the positions of the shards to embed, and yields each store entry as a worker commits it.
Workers claim shards as they go (pipeline/jobs/worker.py), so a slow shard never idles the others.
The coordinator alone builds and publishes the index afterwards (pipeline/jobs/index_run.py).

Each worker has its own pipe to the coordinator (claims, progress, commits), so nothing is
shared between workers that a killed one could leave locked. Failure: a worker that dies
(SIGKILL, OOM killer, segfault) is an EOF on its pipe, noticed at once (one stopped by a signal the run did not send,
a supervisor's SIGTERM to that worker alone, counts the same, the signal named); the others get no new
shard, commit the shards they hold, and the run ends with exit 75 (rerun: only the missing shards
are embedded). A worker that has not reported its engine loaded within ``PETAL_WORKER_START_TIMEOUT`` seconds
of its start (a hung model load, a driver that never answers) is killed and counts as lost the same way. A
worker's ``PetalError`` (bad input 65, disk 74, ...) stops the run the same way
with that error's exit code, and its message says what cures it before a rerun (``scaled.rerun_advice``).
SIGINT/SIGTERM of the coordinator are passed on to the workers (blocked in a worker from its spawn until petal's
import in it takes them, ``_startup.take_in_starting_worker``: from there until its engine is loaded one ends it at
once, quietly), which stop at their next batch boundary; one that has not ended ``SHUTDOWN_GRACE_S`` later (a hung
model load or step) is killed, so the run ends 130/143 in bounded time. A coordinator that dies (SIGKILL, a second
SIGTERM) leaves no worker behind: each ends at once, quietly, as if killed (``worker.exit_orphaned``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

from petal.pipeline.config import ScaleConfig
from petal.pipeline.ingest.parquet import ReadStats
from petal.pipeline.jobs.progress import progress_bar
from petal.pipeline.jobs.report import RunReport
from petal.pipeline.jobs.scaled import unfinished
from petal.pipeline.jobs.worker import (
    WorkerPlan,
    WorkerSlot,
    count_commit,
    entry_written_since,
    no_commits,
    unit_entry_path,
    worker_main,
)
from petal.pipeline.jobs.worker_start import UNGUARDED_MAIN_EXIT, WORKER_NAME_PREFIX, unguarded_main_error
from petal.pipeline.reliability.errors import ConfigError, FlagError, PetalError, TemporaryFailure
from petal.pipeline.reliability.signals import STOP_SIGNALS, StopSignals
from petal.pipeline.store.embeddings import StoreEntry
from petal.pipeline.store.ranges import RangeAssembly

SHUTDOWN_GRACE_S = 30.0  # a worker told to stop (a signal, the run's end) gets this long to end, then SIGKILL
START_TIMEOUT_ENV = "PETAL_WORKER_START_TIMEOUT"
DEFAULT_START_TIMEOUT_S = 600.0  # from a worker's spawn to its "ready" (imports, engine load, CUDA init)


class WorkerFailed(PetalError):
    """A worker's own ``PetalError``, re-raised in the coordinator with its exit code and status."""

    def __init__(self, message: str, exit_code: int, status: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.status = status


def worker_slots(scale: ScaleConfig, device: str, units: int | None = None) -> list[WorkerSlot]:
    """One slot per worker: ``--devices`` picks CUDA devices, ``--workers`` how many processes (round-robin); never
    more than ``units`` (the units of work to hand out: a worker more would load its engine for nothing)."""
    cpu_count = os.cpu_count() or 1
    if scale.devices is None:
        count = _at_most(scale.workers or 1, units)
        if device == "cuda":
            return [WorkerSlot(i, _physical(0), None) for i in range(count)]
        return [WorkerSlot(i, None, max(1, cpu_count // count)) for i in range(count)]
    if device != "cuda":  # NOTE: a flag judged by the run, as --device cuda without CUDA: 2 (was 78)
        raise FlagError(f"--devices {scale.devices} needs CUDA, and the device is {device}: "
                          "on the CPU, use --workers N")
    import torch

    try:
        ids = scale.device_ids(torch.cuda.device_count())
    except ValueError as exc:  # more devices than this host has: the flag's value, judged here (2)
        raise FlagError(str(exc)) from exc
    assert ids is not None
    count = _at_most(scale.workers or len(ids), units)
    return [WorkerSlot(i, _physical(ids[i % len(ids)]), None) for i in range(count)]


def _at_most(count: int, units: int | None) -> int:
    return count if units is None else max(1, min(count, units))


def _physical(device_id: int) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value of visible device ``device_id`` (this process's own list honoured)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        names = [v.strip() for v in visible.split(",") if v.strip()]
        if device_id < len(names):
            return names[device_id]
    return str(device_id)


def start_timeout_s() -> float:
    """How long a worker may take from its spawn to its "ready": ``PETAL_WORKER_START_TIMEOUT`` seconds, else
    ``DEFAULT_START_TIMEOUT_S``. Raises ``ConfigError`` (78) for a value that is not a positive number."""
    text = os.environ.get(START_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_START_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ConfigError(f"{START_TIMEOUT_ENV}={text[:40]!r} is not a number of seconds above 0 "
                          f"(unset: {DEFAULT_START_TIMEOUT_S:g})")
    return value


def check_picklable(plan: WorkerPlan) -> None:
    """The plan crosses to the workers as multiprocessing sends it (between petal's own processes only)."""
    from multiprocessing.reduction import ForkingPickler

    try:
        ForkingPickler.dumps(plan)
    except Exception as exc:
        raise ConfigError(f"worker processes need a picklable engine factory and settings ({exc}); "
                          "pass a module-level class or functools.partial, or run without --workers") from exc


def embed_in_pool(plan: WorkerPlan, slots: list[WorkerSlot], report: RunReport, stop: StopSignals,
                  reads: ReadStats, assembly: RangeAssembly) -> Iterator[tuple[int, StoreEntry]]:
    """Embed ``plan.ranges`` (whole shards and row-group ranges) in worker processes; yields ``(position, entry)``
    as each shard's entry commits (a split shard's when ``assembly`` has assembled its last range).

    Raises ``TemporaryFailure`` (75) when a worker died, ``WorkerFailed`` with a worker's own exit
    code, ``Interrupted`` after SIGINT/SIGTERM; always after every other worker stopped.
    """
    import multiprocessing
    from multiprocessing.connection import wait

    check_picklable(plan)
    if multiprocessing.current_process().daemon:
        raise ConfigError("--devices/--workers start worker processes, and this process is a daemonic "
                          "multiprocessing child, which may not have any: run petal in its own process")
    context = multiprocessing.get_context("spawn")
    pool = _Pool(plan, slots, report, reads, assembly, start_timeout_s(), stop)
    progress = progress_bar(sum(r.num_rows for r in plan.ranges), disable=plan.job.quiet,
                            desc=f"embedding ({len(slots)} workers)")
    try:
        for slot in slots:
            ours, theirs = context.Pipe(duplex=True)
            with _environment("CUDA_VISIBLE_DEVICES", slot.cuda_device), _stop_signals_held():  # NOTE: the child
                # inherits both at spawn: its stop signals wait, blocked, until worker_main takes them (worker.py)
                process = context.Process(target=worker_main, args=(plan, slot, theirs, os.getpid()),
                                          name=f"{WORKER_NAME_PREFIX}{slot.index}", daemon=True)
                process.start()
            theirs.close()  # NOTE: only the child holds it now, so its death is an EOF here
            pool.add(slot, process, ours)
        assembled = assembly.ready()  # shards whose every range an earlier run committed
        pool.committed += len(assembled)
        yield from assembled
        while not pool.finished:
            if stop.requested and pool.stop_deadline is None:  # pass the signal on: workers stop at a batch boundary
                pool.stopping = True
                pool.signal_all(stop.signum)  # type: ignore[arg-type]  # set: stop.requested says so
                pool.stop_deadline = time.monotonic() + SHUTDOWN_GRACE_S
            elif pool.stop_deadline is not None and time.monotonic() > pool.stop_deadline:
                break  # a worker that has not stopped by now (a hung load or step) is killed: shut_down
            for ready in wait(pool.waitables(), timeout=0.2):
                pool.serve(ready, progress)
            pool.kill_unstarted()
            yield from pool.take_commits()
    finally:
        pool.stopping = True
        progress.close()
        pool.shut_down()
        pool.summarize()
    stop.check()
    pool.raise_failure()


_STOP_SIGNAL_NUMBERS = frozenset(int(sig) for sig in STOP_SIGNALS)
_STOP_EXITS = frozenset({*(int(sig) for sig in STOP_SIGNALS), *(128 + int(sig) for sig in STOP_SIGNALS)})


class _Pool:
    """The coordinator's view of its workers: what each reported, which are gone, and how."""

    def __init__(self, plan: WorkerPlan, slots: list[WorkerSlot], report: RunReport, reads: ReadStats,
                 assembly: RangeAssembly, start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 stop: StopSignals | None = None) -> None:
        self.plan = plan
        self.stop = stop  # the run's: a worker stopped by a signal is the run's stop only when the run had one
        self.start_timeout_s = start_timeout_s
        self.assembly = assembly
        self.slots = slots
        self.report = report
        self.reads = reads
        self.processes: list[Any] = []
        self.conns: dict[int, Any] = {}  # worker -> the coordinator's end of its pipe
        self.queue = list(range(len(plan.ranges)))[::-1]  # units not handed out yet (pop from the end)
        self.stopping = False  # a worker failed or a signal came: hand out no more units
        self.ended: dict[int, str] = {}  # worker -> "done" | "interrupted" | "error" | "lost"
        self.summaries: dict[int, dict[str, Any]] = {}
        # worker -> what the coordinator saw it commit (units, rows, tokens): the report's entry of a worker that
        # died without its summary
        self.seen: dict[int, dict[str, int]] = {slot.index: no_commits() for slot in slots}
        self.engines: dict[int, dict[str, Any]] = {}
        self.failures: list[tuple[int, int, str, str]] = []  # (worker, exit code, status, message)
        self.unguarded_main = False  # a worker's start ran the parent's script into petal.index again (worker_start)
        self.committed = 0  # shard entries made by this run (embedded, or assembled from an earlier run's ranges)
        self.units_done = 0
        self.commits: list[tuple[int, StoreEntry]] = []  # handled, not yet handed to the run
        self.handed: dict[int, tuple[int, float]] = {}  # unit -> (worker, time.time() when handed), until committed
        self.started: dict[int, float] = {}  # worker -> time.monotonic() at its spawn
        self.stop_deadline: float | None = None  # time.monotonic() by which workers told to stop are killed

    def add(self, slot: WorkerSlot, process: Any, conn: Any) -> None:
        self.processes.append(process)
        self.conns[slot.index] = conn
        self.started[slot.index] = time.monotonic()

    def kill_unstarted(self) -> None:
        """Kill each worker that has not said "ready" within ``start_timeout_s`` of its spawn (a model load or a
        device init that hangs would keep an unattended run waiting for ever): lost, as a worker that died."""
        now = time.monotonic()
        for worker, started in self.started.items():
            if worker in self.ended or worker in self.engines or now - started < self.start_timeout_s:
                continue
            if self.conns[worker].poll():  # its "ready" (or its end) is here already: served at the next turn
                continue
            slot, process = self.slots[worker], self.processes[worker]
            process.kill()
            process.join(5)
            self.ended[worker] = "lost"
            self.failures.append((worker, 75, "failed",
                                  f"worker {worker} (pid {process.pid}, {slot.label}) did not load its engine within "
                                  f"{self.start_timeout_s:g} s of its start, killed ({START_TIMEOUT_ENV}=SECONDS "
                                  "allows longer)"))
            self._recover(worker)

    def waitables(self) -> list[Any]:
        return [conn for worker, conn in self.conns.items() if worker not in self.ended]

    def serve(self, conn: Any, progress: Any) -> None:
        """Every event waiting on ``conn``; its EOF is the worker's end (a death, without a last word)."""
        worker = next(w for w, c in self.conns.items() if c is conn)
        try:
            while conn.poll():
                event = conn.recv()
                if event[0] == "claim":
                    self._answer(worker, conn)
                else:
                    self.handle(event, progress)
        except (EOFError, OSError):
            if worker not in self.ended:
                self._lost(worker)

    def _answer(self, worker: int, conn: Any) -> None:
        position = self.queue.pop() if self.queue and not self.stopping and not self.failures else None
        try:
            conn.send(position)
        except OSError:  # it died after asking: the position goes back for a rerun to do
            if position is not None:
                self.queue.append(position)
            return
        if position is not None:
            self.handed[position] = (worker, time.time())

    def _lost(self, worker: int) -> None:
        slot, process = self.slots[worker], self.processes[worker]
        process.join(5)
        code = process.exitcode
        if self.signalled and code is not None and abs(code) in _STOP_EXITS:
            # NOTE: a worker still starting when the stop signal was passed on ends by it (128 + its number, or the
            # signal itself) before it can say so: interrupted, as the run is, not 'lost' (a death: kill -9, OOM)
            self.ended[worker] = "interrupted"
            self._recover(worker)
            return
        self.ended[worker] = "lost"
        if code == UNGUARDED_MAIN_EXIT and worker not in self.engines:  # NOTE: the user's to fix: no retry (75)
            self.unguarded_main = True
            self.failures.append((worker, 2, "failed", str(unguarded_main_error())))
            return
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        elif code is not None and code - 128 in _STOP_SIGNAL_NUMBERS:  # a stop signal while it started (_startup)
            how = f"ended by {signal.Signals(code - 128).name} while it started, exit {code}"
        else:
            how = f"exit {code}"
        self.failures.append((worker, 75, "failed", f"worker {worker} (pid {process.pid}, {slot.label}) died ({how})"))
        self._recover(worker)

    @property
    def signalled(self) -> bool:
        """The run has a stop signal (passed on to the workers, or about to be: the Ctrl-C of a terminal reaches
        the coordinator and its workers at once, and a worker's word can come before the coordinator's next turn)."""
        return self.stop_deadline is not None or (self.stop is not None and self.stop.requested)

    def _recover(self, worker: int) -> None:
        """The units a worker that died or failed committed to the store but did not report: the commit is the
        entry's rename, its "commit" event comes after it, and a SIGKILL can fall between the two, or an error (units
        that complete at one step commit one after the other, and a failed commit loses the report of those renamed
        before it: ``StoreSink._commit_ready``). Such an
        entry counts (the report and the exit message say what the store holds, which is what a rerun
        reuses) when its ``entry.json`` was written after the unit was handed out (an entry of an earlier
        run, as ``--full`` replaces, does not)."""
        for unit, (owner, handed_at) in list(self.handed.items()):
            entry = entry_written_since(self.plan, self.assembly.store, unit, handed_at) if owner == worker else None
            if entry is not None:
                self._committed(unit, entry, None, worker)

    @property
    def finished(self) -> bool:
        return len(self.ended) == len(self.slots)

    def take_commits(self) -> list[tuple[int, StoreEntry]]:
        commits, self.commits = self.commits, []
        return commits

    def handle(self, event: tuple[Any, ...], progress: Any) -> None:
        kind, worker = event[0], event[1]
        if kind == "rows":
            progress.update(event[2])
        elif kind == "ready":
            self.engines[worker] = {"pid": event[2], **event[3]}
        elif kind == "commit":
            unit, path = event[2], event[3]
            self._committed(unit, self._entry(unit, path), progress, worker)
        elif kind == "done":
            self.summaries[worker] = event[2]
            self.ended[worker] = "done"
        elif kind == "summary":  # a worker that stops early (its "error" follows): what it committed
            self.summaries[worker] = event[2]
        elif kind == "error":  # NOTE: a worker stopped by the run's stop signal is no failure of its own
            code, status, message = event[2], event[3], event[4]
            self.ended[worker] = "interrupted" if status == "interrupted" else "error"
            if status == "interrupted" and not self.signalled:
                # NOTE: a signal the run did not send (a supervisor's or an OOM guard's SIGTERM to this worker alone):
                # the worker is gone as one that died is (75, naming it), not the run interrupted (was: 143, no worker
                # named, though the coordinator had no signal)
                process, slot = self.processes[worker], self.slots[worker]
                name = signal.Signals(code - 128).name if code - 128 in _STOP_SIGNAL_NUMBERS else f"exit {code}"
                code, status, message = 75, "failed", (f"worker {worker} (pid {process.pid}, {slot.label}) was "
                                                       f"stopped by {name}, which this run did not send")
            self.failures.append((worker, code, status, message))
            self._recover(worker)  # NOTE: a commit that fails after another one of the same step was renamed

    def _committed(self, unit: int, entry: StoreEntry, progress: Any, worker: int) -> None:
        self.handed.pop(unit, None)
        count_commit(self.seen[worker], self.plan.ranges[unit].whole, entry)
        self.units_done += 1
        if progress is not None:
            progress.update(sum(int(n) for n in entry.meta["counts"]["skipped"].values()))
        done = self.assembly.commit(unit, entry)
        self.committed += len(done)
        self.commits.extend(done)

    def _entry(self, unit: int, path: str) -> StoreEntry:
        """The entry (or range part) the worker committed for ``unit``, read back and checked."""
        expected = unit_entry_path(self.plan, self.assembly.store, unit)
        assert str(expected) == path, (unit, path)
        return self.assembly.store.read_entry(expected)

    def signal_all(self, signum: int) -> None:
        for process in self.processes:
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)

    def shut_down(self) -> None:
        """Every worker ends: asked with SIGTERM (it stops at a batch boundary), killed after a grace period."""
        if any(p.is_alive() for p in self.processes) and not self.finished and self.stop_deadline is None:
            self.signal_all(signal.SIGTERM)
        deadline = self.stop_deadline if self.stop_deadline is not None else time.monotonic() + SHUTDOWN_GRACE_S
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
        for conn in self.conns.values():
            conn.close()

    def summarize(self) -> None:
        """The run report: each worker's summary (``workers``) and the totals."""
        workers = []
        for slot in self.slots:
            # NOTE: a worker that died has no summary: the coordinator's counts alone (its recovered units too)
            process = self.processes[slot.index] if slot.index < len(self.processes) else None
            pid = self.engines.get(slot.index, {}).get("pid", process.pid if process is not None else None)
            summary = self.summaries.get(slot.index, {"worker": slot.index, "pid": pid, "device": slot.label})
            # NOTE: the counts are what the coordinator saw committed: a failed worker's summary lacks the units it
            # committed and did not report (``_recover``)
            workers.append({**summary, **self.seen[slot.index], "status": self.ended.get(slot.index, "lost")})
        self.report.workers = workers
        # NOTE: no tokens from here: the report's are its committed shard entries' (index_run.tally_commit)
        self.report.retries["oom_splits"] += sum(int(w.get("oom_splits", 0)) for w in workers)
        self.reads.retries += sum(int(w.get("read_retries", 0)) for w in workers)
        starts = [w["timings_s"]["start"] for w in workers if "timings_s" in w]
        if starts:
            self.report.timings_s["model_load"] = max(starts)
        self.report.engine = {"workers": len(self.slots),
                              "engines": [self.engines.get(s.index, {"device": s.label}) for s in self.slots]}

    def raise_failure(self) -> None:
        if not self.failures:
            return
        if self.unguarded_main:  # NOTE: every worker fails the same way, before any work: said once, as it is
            raise unguarded_main_error()
        # the user's to fix first (bad input, disk, settings), then a lost worker (retry), then the rest
        rank = {75: 1, 1: 2, 130: 3, 143: 3}
        _, code, status, message = min(self.failures, key=lambda f: rank.get(f[1], 0))
        more = "" if len(self.failures) == 1 else f" (and {len(self.failures) - 1} more worker failure(s))"
        ranges = f" ({self.units_done} of this run's {len(self.plan.ranges)} units)" if self.assembly.plan.split else ""
        detail = f"{message}{more}; {unfinished(self.report, self.committed, code, ranges)}"
        if code == 75:
            raise TemporaryFailure(detail)
        raise WorkerFailed(detail, code, status)


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[None]:
    """The stop signals blocked in this thread for the block (a signal that comes meanwhile is delivered at its end):
    a worker started inside it inherits the mask, so a Ctrl-C to the process group (or the signal the coordinator
    passes on) waits in the worker until petal's import there takes it (``_startup.take_in_starting_worker``, then
    ``worker.take_stop_signals``). Before, the
    worker's Python start-up and the imports of unpickling its target (numpy, pyarrow) ran at the default action:
    a raw ``KeyboardInterrupt`` traceback from each worker, before the run's own one line.

    NOTE: blocked, not ignored: an ignored signal would be lost (the coordinator passes a stop on once), and a worker
    started ignoring one keeps it ignored (``signals.not_ignored``). SIGKILL cannot be blocked: a worker whose start
    hangs is still killed (``SHUTDOWN_GRACE_S``, the start timeout), and one whose coordinator dies ends by the
    parent watch (``worker.PARENT_POLL_S``) as soon as ``worker_main`` runs."""
    if not hasattr(signal, "pthread_sigmask"):  # no POSIX signal masks (Windows)
        yield
        return
    from multiprocessing import resource_tracker

    # NOTE: multiprocessing starts its resource tracker at the first spawn, and that start ends by unblocking SIGINT
    # and SIGTERM in this thread (CPython's ensure_running): inside the block, the first worker started with both open
    resource_tracker.ensure_running()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@contextlib.contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    """``os.environ[name] = value`` for the block (``None``: left as it is)."""
    if value is None:
        yield
        return
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
