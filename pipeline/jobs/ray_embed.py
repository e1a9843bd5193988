"""The embed phase on Ray Data: ``petal index ... --ray [ADDRESS]`` (``pip install 'petal[ray]'``).

A Ray Dataset holds one row per shard to embed; ``map_batches`` sends them (one at a time) through
an actor pool, each actor holding one petal engine (one GPU: packing, CUDA graphs and LazyTensors
inside). An actor streams its shard's Parquet itself, tokenizes it and commits its store entry under
``OUT/store`` exactly as the single-process run does (same row numbers, skips, per-shard commit),
so ``--out`` must be storage every node sees (NFS, a shared mount). The driver (this process)
receives the commits as they stream back and then builds and publishes the index.

Resume is unchanged: committed shards are not in the dataset. A killed actor is restarted by Ray and
its shard retried (a half-written entry stays in ``store/tmp``, removed by the next run); a run that
fails anyway ends with exit 75 and the rerun embeds only what is missing. An actor that has not loaded its engine
within ``PETAL_WORKER_START_TIMEOUT`` seconds of beginning to (as for the local worker pool) is killed: exit 75.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from petal.pipeline.config import ScaleConfig, ray_address_problem
from petal.pipeline.ingest.parquet import ReadStats
from petal.pipeline.jobs.progress import progress_bar
from petal.pipeline.jobs.report import RunReport
from petal.pipeline.jobs.scaled import unfinished
from petal.pipeline.jobs.worker import WorkerPlan, claimed_documents, entry_written_since, load_engine, unit_entry_path
from petal.pipeline.jobs.workers import START_TIMEOUT_ENV, start_timeout_s
from petal.pipeline.reliability.errors import (
    ConfigError,
    Interrupted,
    PetalError,
    TemporaryFailure,
    UsageError,
    unmapped_error,
)
from petal.pipeline.reliability.signals import STOP_SIGNALS, StopSignals
from petal.pipeline.store.embeddings import EmbeddingStore, StoreEntry
from petal.pipeline.store.ranges import RangeAssembly

RAY_MISSING = "--ray needs Ray Data, which is not installed: pip install 'petal[ray]' (or pip install 'ray[data]')"


def import_ray() -> Any:
    """``ray`` with Ray Data, or a ``ConfigError`` (78) that names the pip command."""
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise ConfigError(RAY_MISSING) from exc
    return ray


_RAY_LOGGERS = ("ray", "ray.data")  # NOTE: each has its own console handler and does not propagate
_QUIET = [0]  # how many ray_console_quiet blocks are open (Ray's pushed errors are dropped while any is)


@contextlib.contextmanager
def ray_console_quiet() -> Iterator[None]:
    """Ray's loggers silent on stderr for the block: Ray Data logs a task's failure as a full traceback of its own
    internals (and INFO lines on its plans and progress) before petal's one-line message, which a cron or Airflow log
    should end with alone. Ray Data's records, the tracebacks too, are still written to its session's log files
    (``ray_log_directory``), which petal's failure message names; the handlers are as they were after the block."""
    muted: list[tuple[logging.Handler, int]] = []
    for name in _RAY_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                muted.append((handler, handler.level))
                handler.setLevel(logging.CRITICAL + 1)
    _QUIET[0] += 1
    try:
        yield
    finally:
        _QUIET[0] -= 1
        for handler, level in muted:
            handler.setLevel(level)


def ray_errors_off_stdout() -> None:
    """Ray's driver prints each error its cluster pushes to it (an actor whose constructor failed, a task to be
    retried: a traceback each) on stdout, from a thread of its own (``ray._private.worker.listen_error_messages``),
    where ``--json`` writes the report. They go to stderr instead, and nowhere while a petal run keeps Ray's console
    quiet (``ray_console_quiet``; Ray's session logs have them). Once per process; the listener looks the function up
    at each message, so a Ray already initialized is covered too."""
    module = sys.modules.get("ray._private.worker")
    printer = getattr(module, "print_to_stdstream", None)
    if printer is None or getattr(printer, "petal_stderr", False):  # NOTE: a private function of Ray's: else as is
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        if not _QUIET[0]:
            printer({**data, "is_err": True}, ignore_prefix)

    to_stderr.petal_stderr = True  # type: ignore[attr-defined]
    module.print_to_stdstream = to_stderr  # type: ignore[union-attr]


def ray_log_directory() -> str | None:
    """Where Ray Data writes this session's logs (``None`` before ``ray.init``, or where Ray does not say)."""
    try:
        from ray.data._internal.logging import get_log_directory

        return get_log_directory()
    except Exception:  # NOTE: a private helper of Ray's: a version without it names no directory
        return None


CONNECT_TIMEOUT_S = 5.0  # a cluster address that does not answer a TCP connect in this long is refused (75)


def connect(scale: ScaleConfig) -> Any:
    """``ray``, connected: to ``scale.ray_address``, else ``RAY_ADDRESS``, else a new local instance.

    An address ``host:port`` where nothing answers is a ``TemporaryFailure`` (75) in seconds (``ray.init`` would
    retry it for minutes, then for ever). ``ray.init`` replaces the process's SIGTERM handler with one that raises
    ``SystemExit``: petal's stop signals (pipeline/reliability/signals.py) are put back, and a SIGTERM that came
    during ``ray.init`` is the run's clean stop (143), not an internal error."""
    ray = import_ray()
    ray_errors_off_stdout()
    env = os.environ.get("RAY_ADDRESS")
    if scale.ray_address in (None, "auto") and env:  # NOTE: judged as --ray's is (Ray's own error was 75, "retry")
        problem = ray_address_problem(env)
        if problem is not None:
            raise ConfigError(f"cannot connect to Ray at {env} (RAY_ADDRESS): {problem} (or unset it for a local Ray)")
    if ray.is_initialized():
        _same_cluster(ray, scale)
    else:
        where = _address(scale)
        if where is not None:
            _check_reachable(*where)
        handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        try:
            with ray_console_quiet():
                ray.init(address=scale.ray_address, log_to_driver=False)
        except SystemExit as exc:  # Ray's own SIGTERM handler: sys.exit(SIGTERM)
            if exc.code == signal.SIGTERM:
                raise Interrupted(signal.SIGTERM) from None
            raise
        except ValueError as exc:  # NOTE: an address Ray cannot parse (RAY_ADDRESS: --ray's are judged as flags)
            shown = where[0] if where is not None else scale.ray_address or _env_address() or "RAY_ADDRESS/local"
            raise ConfigError(f"cannot connect to Ray at {shown}: {exc}") from exc
        except (ConnectionError, RuntimeError) as exc:
            shown = where[0] if where is not None else scale.ray_address or _env_address() or "RAY_ADDRESS/local"
            raise TemporaryFailure(f"cannot connect to Ray at {shown}: {exc}") from exc
        except OSError as exc:
            if exc.errno is not None:
                raise  # a file system's error (a full or read-only temp dir): 74/73 naming it, as petal's own
            # NOTE: Ray's own checks of its setup (a RAY_TMPDIR too long for its sockets) say so without an errno
            raise ConfigError(f"cannot start Ray: {exc} (RAY_TMPDIR sets where a local Ray keeps its files)") from exc
        finally:
            if threading.current_thread() is threading.main_thread():
                for sig, handler in handlers.items():
                    if handler is not None:
                        signal.signal(sig, handler)
    return ray


def _same_cluster(ray: Any, scale: ScaleConfig) -> None:
    """Ray is connected already in this process (an earlier run, or the caller's own ``ray.init``): a ``ray_address``
    (``--ray ADDRESS``) naming another GCS is a ``UsageError``, never a run on the cluster connected (it was taken
    silently). NOTE: only a ``host:port`` is compared; ``auto``, ``ray://`` and none take the cluster connected."""
    where = _address(scale) if scale.ray_address not in (None, "auto") else None
    if where is None:
        return
    try:
        connected = str(ray.get_runtime_context().gcs_address)
    except Exception:  # NOTE: a Ray without it (Ray Client): nothing to compare
        return
    host, _, port = connected.rpartition(":")
    if (_host_ip(host.strip("[]")), port) != (_host_ip(where[1]), str(where[2])):
        raise UsageError(f"ray_address {scale.ray_address!r}: this process is connected to the Ray cluster at "
                         f"{connected} already (ray.init earlier); one process talks to one cluster: run in another "
                         "process, or ray.shutdown() first")


def _host_ip(host: str) -> str:
    """``host``'s address (``localhost`` and ``127.0.0.1`` name one host), or ``host`` where it does not resolve."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _env_address() -> str | None:
    """``RAY_ADDRESS`` as shown in a message (``None`` when unset or empty)."""
    address = os.environ.get("RAY_ADDRESS")
    return f"{address} (RAY_ADDRESS)" if address else None


def _address(scale: ScaleConfig) -> tuple[str, str, int] | None:
    """``(as shown, host, port)`` of the cluster ``ray.init`` will connect to by GCS address (``--ray ADDRESS``, else
    ``RAY_ADDRESS``); ``None`` for a new local instance, ``auto``, ``ray://`` (Ray Client checks its own) and an
    address without a port (Ray's to judge)."""
    flag = scale.ray_address
    address = flag if flag not in (None, "auto") else os.environ.get("RAY_ADDRESS") or flag
    if not address or address in ("auto", "local") or "://" in address:
        return None
    shown = f"{address} (RAY_ADDRESS)" if address != flag else address
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    return shown, host.strip("[]"), int(port)


# an HTTP/2 client's connection preface and an empty SETTINGS frame: a gRPC server (a Ray GCS) answers with its own
# SETTINGS frame at once (RFC 9113 3.4)
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _check_reachable(shown: str, host: str, port: int) -> None:
    """A ``TemporaryFailure`` (75) in at most ~2 x ``CONNECT_TIMEOUT_S`` unless a gRPC server answers at the address:
    ``ray.init`` waits for ever on one that accepts connections and never answers (a wrong port, a hung GCS)."""
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        raise TemporaryFailure(f"cannot connect to Ray at {shown}: nothing answers there ({exc.strerror or exc}); "
                               "start the cluster or fix the address") from exc
    if os.environ.get("RAY_USE_TLS", "").lower() in ("1", "true"):  # a TLS handshake first: Ray's to judge
        sock.close()
        return
    with sock:
        try:
            sock.sendall(_HTTP2_PREFACE)
            answer = sock.recv(9)  # a frame header: length (3), type (1), flags (1), stream (4)
        except TimeoutError:
            raise TemporaryFailure(f"cannot connect to Ray at {shown}: it accepts connections but does not answer "
                                   f"within {CONNECT_TIMEOUT_S:g} s (a hung cluster, or not the port of a Ray head's "
                                   "GCS: 6379 unless set); check the cluster or fix the address") from None
        except OSError as exc:
            answer = b""
            if exc.errno not in (errno.ECONNRESET, errno.EPIPE):
                raise TemporaryFailure(f"cannot connect to Ray at {shown}: {exc.strerror or exc}") from exc
    if len(answer) < 4 or answer[3] != 0x04:  # not a SETTINGS frame: not a gRPC server
        raise TemporaryFailure(f"cannot connect to Ray at {shown}: what answers there is not a Ray cluster's GCS "
                               "(gRPC); fix the address (a Ray head's GCS port: 6379 unless set)")


def ray_device(device: str, scale: ScaleConfig) -> str:
    """Where the actors run: ``auto`` is ``cuda`` when the cluster has GPUs (the driver may have none)."""
    if device == "cpu":
        return "cpu"
    gpus = int(connect(scale).cluster_resources().get("GPU", 0))
    if device == "cuda" and gpus == 0:
        raise ValueError("--device cuda was asked for, but the Ray cluster has no GPU")
    return "cuda" if gpus else "cpu"


class _Positions:
    """Claims served from a fixed list (the units of one Ray batch)."""

    def __init__(self, positions: list[int]) -> None:
        self._left = positions[::-1]

    def claim(self, closing: threading.Event) -> int | None:
        return self._left.pop() if self._left else None


class ShardEmbedder:
    """A Ray actor: one engine, loaded once; each call embeds and commits the batch's units (shards, ranges)."""

    def __init__(self, plan: WorkerPlan, starts: Any) -> None:
        import ray
        from tqdm import tqdm

        loading = time.perf_counter()
        me = ray.get_runtime_context().current_actor
        ray.get(starts.loading.remote(me, os.getpid(), ray.util.get_node_ip_address()))
        tqdm.set_lock(threading.RLock())  # no multiprocessing semaphore per actor
        self.plan = plan
        try:
            self.engine = load_engine(plan)  # NOTE: a sleep at its fault point is a load that hangs (the start timeout)
        except BaseException as exc:
            error = _contract_error(plan, exc)
            # NOTE: Ray hands the driver an ActorDiedError that has lost this exception (and its exit code): say it here
            with contextlib.suppress(Exception):
                ray.get(starts.failed.remote(error.exit_code, error.status, str(error)), timeout=10)
            raise error from exc
        starts.loaded.remote(os.getpid(), ray.util.get_node_ip_address())
        self.load_s = round(time.perf_counter() - loading, 3)
        self.store = EmbeddingStore(plan.store_root)  # NOTE: never ``open()``: others write in its tmp/
        if plan.job.full:
            self.store.join_full_run()  # its commits are the --full run's (resumed after a stop)
        self.store.remember_sha256(plan.shards, plan.sha256)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        from petal.pipeline.ingest.prefetch import Prefetcher
        from petal.pipeline.ingest.tokens import tokenize_documents, tokenizer_for
        from petal.pipeline.jobs.index_run import embed_shards

        plan = self.plan
        report, stats, closing = RunReport(command="index-actor"), ReadStats(), threading.Event()
        documents = claimed_documents(plan, _Positions([int(p) for p in batch["position"]]), closing, stats)
        chunks = Prefetcher(tokenize_documents(documents, tokenizer_for(plan.spec), plan.job.tokenize_workers or 1),
                            depth=16)
        out: dict[str, list] = {"position": [], "entry": [], "rows": [], "tokens": []}
        try:
            with contextlib.closing(embed_shards(chunks, plan.shards, plan.fingerprints, self.store, plan.settings,
                                                 self.engine, plan.transform, replace(plan.job, quiet=True), report,
                                                 StopSignals(), None, plan.ranges)) as commits:
                for position, entry in commits:
                    out["position"].append(position)
                    out["entry"].append(str(entry.path))
                    out["rows"].append(entry.num_embedded)
                    out["tokens"].append(entry.num_tokens)  # the committed rows' (none of a unit dropped)
        except BaseException as exc:
            error = _contract_error(plan, exc)
            if error is exc:
                raise
            raise error from exc
        finally:
            closing.set()
            chunks.close()
        n = len(out["position"])
        for name, count in (("read_retries", stats.retries), ("oom_splits", report.retries["oom_splits"])):
            out[name] = [count if i == 0 else 0 for i in range(n)]  # the batch's, counted once
        out["pid"] = [os.getpid()] * n
        # the actor's engine and its counters so far, as a worker process reports them (pipeline/jobs/worker.py)
        out["actor"] = [json.dumps({"engine": self.engine.describe(), "stats": self.engine.stats.as_dict(),
                                    "timings_s": {"start": self.load_s}})] * n
        return out


def _contract_error(plan: WorkerPlan, exc: BaseException) -> Any:
    """``exc`` as the driver's exit-code contract has it (``unmapped_error``: a disk's 74, a model's 78, ...); a bug
    stays itself (exit 1 at the driver is Ray's 75: the run failed)."""
    error = unmapped_error(exc, [plan.store_root.parent])
    return exc if error is None else error


class _ActorStarts:
    """A Ray actor of the driver's (no CPU): each ``ShardEmbedder`` says when it begins loading its engine and when
    it has, so the driver can tell an actor whose load hangs from one that embeds a long shard; and which actors the
    run started, so that none outlives it."""

    def __init__(self) -> None:
        self._loading: dict[tuple[str, int], tuple[float, Any]] = {}  # (node, pid) -> (monotonic here, handle)
        self._started: list[Any] = []
        self._failures: list[tuple[int, str, str]] = []  # (exit code, status, message) of an engine that did not load

    def loading(self, actor: Any, pid: int, node: str) -> None:
        self._loading[(node, pid)] = (time.monotonic(), actor)
        self._started.append(actor)

    def started(self) -> list[Any]:
        return list(self._started)

    def loaded(self, pid: int, node: str) -> None:
        self._loading.pop((node, pid), None)

    def failed(self, exit_code: int, status: str, message: str) -> None:
        self._failures.append((exit_code, status, message))

    def failures(self) -> list[tuple[int, str, str]]:
        return list(self._failures)

    def overdue(self, seconds: float) -> list[tuple[str, int, Any]]:
        """``(node, pid, handle)`` of each actor loading for ``seconds`` or more; forgotten once told."""
        now = time.monotonic()
        late = [key for key, (since, _) in self._loading.items() if now - since >= seconds]
        return [(node, pid, self._loading.pop((node, pid))[1]) for node, pid in late]


class _StartWatch:
    """Kills each actor that has not loaded its engine within ``timeout_s`` of beginning to (a model load or a device
    init that hangs would keep an unattended run waiting for ever, as Ray waits for an actor's constructor without a
    limit); Ray Data then fails the run, which ``failure`` explains (``PETAL_WORKER_START_TIMEOUT``)."""

    def __init__(self, ray: Any, timeout_s: float) -> None:
        self._ray = ray
        self.timeout_s = timeout_s
        self.starts = ray.remote(num_cpus=0)(_ActorStarts).remote()
        self.killed: list[str] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="petal-ray-starts", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(min(0.5, self.timeout_s / 4)):
            try:
                overdue = self._ray.get(self.starts.overdue.remote(self.timeout_s))
            except Exception:  # Ray going down with the run: nothing left to watch
                return
            for node, pid, handle in overdue:
                with contextlib.suppress(Exception):
                    self._ray.kill(handle, no_restart=True)
                self.killed.append(f"pid {pid} on {node}")

    @property
    def failure(self) -> str | None:
        if not self.killed:
            return None
        return (f"the Ray actor{'s' if len(self.killed) > 1 else ''} {', '.join(self.killed)} did not load "
                f"{'their engines' if len(self.killed) > 1 else 'its engine'} within {self.timeout_s:g} s of "
                f"starting to, killed ({START_TIMEOUT_ENV}=SECONDS allows longer)")

    def load_error(self) -> tuple[int, str, str] | None:
        """``(exit code, status, message)`` of the first actor whose engine failed to load (a model's error, 78), as
        that actor said it; ``None`` if none did."""
        try:
            failures = self._ray.get(self.starts.failures.remote(), timeout=10)
        except Exception:  # NOTE: the helper actor gone with the cluster: Ray's own words are all there is
            return None
        return failures[0] if failures else None

    def close(self, early: bool) -> None:
        """The watch ends; ``early`` (a stop signal, a failed unit, the driver's own error): with every actor the run
        started, so that none embeds on, holding the cluster's GPUs (Ray Data stops its pool only when its iterator is
        collected; a finished run's actors are gone already)."""
        self._done.set()
        self._thread.join(5)
        with contextlib.suppress(Exception):
            for actor in self._ray.get(self.starts.started.remote(), timeout=10) if early else []:
                with contextlib.suppress(Exception):
                    self._ray.kill(actor, no_restart=True)
        with contextlib.suppress(Exception):
            self._ray.kill(self.starts)


def embed_on_ray(plan: WorkerPlan, scale: ScaleConfig, report: RunReport, stop: StopSignals,
                 reads: ReadStats, assembly: RangeAssembly) -> Iterator[tuple[int, StoreEntry]]:
    """Embed ``plan.ranges`` (whole shards, row-group ranges) through a Ray Data actor pool; yields
    ``(position, entry)`` as each shard's entry commits (a split shard's once its last range is assembled)."""
    with ray_console_quiet():  # NOTE: Ray's loggers run in its executor threads, while this generator is suspended too
        yield from _embed_on_ray(plan, scale, report, stop, reads, assembly)


def _embed_on_ray(plan: WorkerPlan, scale: ScaleConfig, report: RunReport, stop: StopSignals,
                  reads: ReadStats, assembly: RangeAssembly) -> Iterator[tuple[int, StoreEntry]]:
    ray = connect(scale)
    context = ray.data.DataContext.get_current()
    # NOTE: petal's own bar (pipeline/jobs/progress.py), as without Ray: Ray Data's bars redraw on a terminal and log
    # an operator table every few seconds in a log, and its log lines are silenced (ray_console_quiet) anyway
    context.enable_progress_bars = False
    # an actor's PetalError reaches the driver as itself (its exit code, its message), not as a UserCodeException
    # that lost it on the way (the exception's cause does not survive pickling)
    context.raise_original_map_exception = True
    gpu = plan.config.device == "cuda"
    units = len(plan.ranges)
    # never more actors than units: one more would load its engine (a GPU's memory) for nothing
    actors = min(units, scale.workers or (max(1, int(ray.cluster_resources().get("GPU", 0))) if gpu else 1))
    dataset = ray.data.from_items([{"position": i} for i in range(units)], override_num_blocks=max(1, units))
    watch = _StartWatch(ray, start_timeout_s())
    # NOTE: a fixed pool through compute=: map_batches' concurrency= is deprecated (removed in Ray 2.64)
    results = dataset.map_batches(ShardEmbedder, fn_constructor_args=(plan, watch.starts), batch_size=1,
                                  compute=ray.data.ActorPoolStrategy(size=actors), num_gpus=1 if gpu else 0,
                                  num_cpus=1, zero_copy_batch=True)
    store = assembly.store
    per_actor: dict[int, dict[str, int]] = {}
    described: dict[int, dict[str, Any]] = {}  # pid -> the actor's engine, stats and load time, as last told
    committed = 0  # shard entries made by this run (embedded, or assembled from an earlier run's ranges)
    started = time.time()  # an entry written from now on is this run's
    reported: set[int] = set()
    progress = progress_bar(sum(r.num_rows for r in plan.ranges), disable=plan.job.quiet,
                            desc=f"embedding ({actors} Ray actor{'s' if actors > 1 else ''})")
    rows = iter(results.iter_rows())
    finished = False
    try:
        ready = assembly.ready()  # shards whose every range an earlier run committed
        committed += len(ready)
        yield from ready
        while True:
            with stop.interruptible():  # a stop signal ends the wait for the next unit at once, not after it
                row = next(rows, None)
            if row is None:
                finished = True
                break
            unit = int(row["position"])
            reported.add(unit)
            part = plan.ranges[unit]
            expected = unit_entry_path(plan, store, unit)
            assert str(expected) == row["entry"], row
            entry = store.read_entry(expected)
            progress.update(part.num_rows)  # the unit's rows, embedded or skipped: an actor says when it is done
            actor = per_actor.setdefault(int(row["pid"]), {"shards": 0, "ranges": 0, "rows": 0, "tokens": 0,
                                                           "read_retries": 0, "oom_splits": 0})
            actor["shards" if part.whole else "ranges"] += 1
            for name in ("rows", "tokens", "read_retries", "oom_splits"):
                actor[name] += int(row[name])
            described[int(row["pid"])] = json.loads(row["actor"])
            for position, shard_entry in assembly.commit(unit, entry):
                committed += 1
                yield position, shard_entry
    except Exception as exc:
        if isinstance(exc, PetalError) and not isinstance(exc, ray.exceptions.RayError):
            if stop.requested:  # NOTE: units committed but not reported yet (ranges too) are the store's: counted
                for unit, entry in _unreported_commits(plan, store, reported, started, ranges=True):
                    yield from assembly.commit(unit, entry)
            raise  # the driver's own (a stop signal, a damaged entry)
        for unit, entry in _unreported_commits(plan, store, reported, started):
            for position, shard_entry in assembly.commit(unit, entry):
                committed += 1
                yield position, shard_entry  # the run counts it (report, exit message) as the store holds it
        raise _ray_failure(exc, report, committed, watch.failure, watch.load_error()) from exc
    finally:
        progress.close()
        close = getattr(rows, "close", None)  # NOTE: Ray Data's executor stops (no unit is handed out any more)
        if close is not None:
            with contextlib.suppress(Exception):
                close()
        watch.close(early=not finished)
        # NOTE: a run stopped by its signal stops its actors too (was: "done" whatever happened)
        status = "done" if finished else "interrupted" if stop.requested else "error"
        report.workers = [{"worker": i, "pid": pid, "device": "cuda" if gpu else "cpu", **counts,
                           **described.get(pid, {}), "status": status}
                          for i, (pid, counts) in enumerate(sorted(per_actor.items()))]
        # NOTE: no tokens from here: the report's are its committed shard entries' (index_run.tally_commit)
        report.retries["oom_splits"] += sum(w["oom_splits"] for w in report.workers)
        reads.retries += sum(w["read_retries"] for w in report.workers)
        starts = [w["timings_s"]["start"] for w in report.workers if "timings_s" in w]
        if starts:
            report.timings_s["model_load"] = max(starts)
        report.engine = {"ray": True, "actors": actors, "address": scale.ray_address or "local", "workers": actors,
                         "engines": [{"pid": w["pid"], **w["engine"]} for w in report.workers if "engine" in w]}


def _unreported_commits(plan: WorkerPlan, store: EmbeddingStore, reported: set[int],
                        since: float, ranges: bool = False) -> list[tuple[int, StoreEntry]]:
    """Whole shards an actor committed to the store (the entry's rename) whose row never reached the driver:
    an actor can die, or its batch fail, between the two. They count (the exit message says what the store
    holds, which the rerun reuses) when written during this run (``entry_written_since``). A split shard's
    ranges are assembled by the driver only, so an unreported range never makes a committed shard; ``ranges``:
    list those too (a stopped run's report names the ranges it committed)."""
    found: list[tuple[int, StoreEntry]] = []
    for unit, part in enumerate(plan.ranges):
        if unit not in reported and (part.whole or ranges):
            entry = entry_written_since(plan, store, unit, since)
            if entry is not None:
                found.append((unit, entry))
    return found


def _ray_failure(exc: BaseException, report: RunReport, committed: int, reason: str | None = None,
                 load_error: tuple[int, str, str] | None = None) -> PetalError:
    """A Ray error as the exit-code contract has it: an actor's ``PetalError`` keeps its code; the rest is 75
    (``reason``: what petal knows failed, an actor it killed, in place of Ray's words; ``load_error``: the
    ``(exit code, status, message)`` an actor whose engine did not load said, which Ray's error has lost). Its message
    ends with what the store holds of the run's shards and what a rerun does (``scaled.unfinished``; ``committed``:
    the shard entries this run made)."""
    from petal.pipeline.jobs.workers import WorkerFailed

    if load_error is not None:
        code, status, message = load_error
        return WorkerFailed(f"{message}; {unfinished(report, committed, code)}", code, status)
    if reason is not None:
        return TemporaryFailure(f"{reason}; {unfinished(report, committed, 75)}")
    cause: BaseException | None = exc
    seen = 0
    while cause is not None and seen < 10:  # RayTaskError wraps the actor's exception (``cause``)
        inner = getattr(cause, "cause", None) or cause.__cause__
        # NOTE: a RayTaskError(PetalError) is a PetalError too, whose text is Ray's traceback: the actor's own is inside
        if isinstance(cause, PetalError) and not isinstance(inner, PetalError):
            message = (str(cause).strip().splitlines() or [type(cause).__name__])[0]  # Ray appends its retry notes
            return WorkerFailed(f"{message}; {unfinished(report, committed, cause.exit_code)}", cause.exit_code,
                                cause.status)
        cause = inner
        seen += 1
    from ray.exceptions import RayError

    failed = _first_line(exc)
    inner = getattr(exc, "cause", None)  # a task's own exception, under Ray's "ray::MapWorker(...).submit()" line
    if isinstance(inner, BaseException) and not isinstance(inner, RayError):
        failed = f"{type(inner).__name__}: {_first_line(inner)}"
    where = ray_log_directory()
    logs = f" (Ray's logs: {where})" if where else ""
    return TemporaryFailure(f"the Ray run failed ({failed}){logs}; {unfinished(report, committed, 75)}")


def _first_line(exc: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()  # Ray colours its task names
    return text.splitlines()[0][:300] if text else type(exc).__name__
