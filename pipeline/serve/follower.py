"""Following re-indexing: when ``petal index``/``rebuild`` publishes a new version of OUT (CURRENT
changes), load it beside the live one, check it, and swap.

```
poll OUT/CURRENT (every --reload-interval-s) -> changed (or written again): in a thread, its manifest: same
model, metric and output transform? -> open it (the cheap checks of every file, FAISS, ids) -> the same checks on
what opened -> swap `live` (one reference assignment)
```

A version its manifest refuses is never loaded (one of another model may not fit beside the live one), and CURRENT
set back to the live version is not loaded again either.

A search takes ``live`` once and keeps that object to the end, so in-flight searches finish on the
version they started on and every answer comes from exactly one version; the old version's memory
returns when its last search drops it, and so does its lease (``leases.py``: a ``petal index`` run does
not prune the version a server serves; once released, the next run may). A version that fails to open
or was built with another model or output transform is refused: the old version keeps serving and
``/ready`` and ``petal_index_refused`` say why.

A version that fails to open (not there yet, a file missing or short, an I/O error, corrupt) or whose GPU
copy cannot be made is tried again while CURRENT names it, after 1, 2, 4 ... s (at most 60 s apart): a
version copied in by hand (``cp -a``, ``rsync``: CURRENT sorts before ``versions/``) may still be arriving.
One built with another model, metric or transform waits for CURRENT to change, and so does a CURRENT that names
no version (missing, empty, or not a version id: "current", said once; the live version keeps serving), and so does
a version directory whose manifest records another version id ("version": copied or renamed by hand; it was taken for
the version it records, or for a return to the live one). An index
of precomputed vectors (``--vectors-column``, no model) is followed by its own rules: a new version must be of
precomputed vectors too, of the same dim, metric and stored format (its clients send rows in its space); a version
built with a model replacing it, or one of precomputed vectors replacing a model's, is refused ("model"). CURRENT
written again with the same name (``echo V > OUT/CURRENT``: a new ctime, whatever its mtime; or the file a link
CURRENT names) is a new publish: tried at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import stat
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from petal.engine.loader import ModelSpec
from petal.pipeline.index.search import IndexReader, current_pointer
from petal.pipeline.jobs.query import SearchIndex
from petal.pipeline.layout import (
    SHOWN_POINTER_CHARS,
    VERSION_RE,
    MislabeledVersion,
    OutputDir,
    not_an_index,
    resolve_index_dir,
)
from petal.pipeline.manifest import Manifest, ModelRecord, StoredFormat, model_mismatch
from petal.pipeline.reliability.errors import ConfigError, PetalError, one_line, quote_path, quote_text
from petal.pipeline.reliability.faults import fault
from petal.pipeline.serve.leases import lease, release_with
from petal.pipeline.serve.metrics import ServeMetrics
from petal.pipeline.store.outputs import OutputTransform

log = logging.getLogger("petal.serve")


RETRY_FIRST_S = 1.0  # a transient refusal is tried again after this, then twice as long each time
RETRY_MAX_S = 60.0
COLLECT_FIRST_S = 1.0  # a version swapped out and still alive is collected for after this, then twice as long each time


class OpenFailed(Exception):
    """Raised by a ``prepare`` hook for what opening finds, only later: a file of the version short or corrupt where
    the hook reads it in full (its id map). The version is refused as ``open``, as such a file found by the open; what
    the hook itself cannot make (a GPU copy) is ``prepare``."""


@dataclass(frozen=True)
class Refusal:
    version: str
    reason: str  # short: model, output, metric, max_length, prompt, open, prepare, current, version
    message: str
    retry_in_s: float | None = None  # tried again after this many seconds (None: when CURRENT changes)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "reason": self.reason, "message": self.message}
        if self.retry_in_s is not None:
            out["retry_in_s"] = self.retry_in_s
        return out


Pointer = tuple[str | None, tuple[int, ...] | None]


def shown(pointer: str) -> str:
    """What CURRENT holds, as ``/ready``, a metric label and the log may show it: a version id as it is, anything
    else quoted, escaped (an escape sequence written into CURRENT never reaches a terminal) and cut."""
    return pointer if VERSION_RE.match(pointer) else quote_text(pointer, SHOWN_POINTER_CHARS)


def _pointer_state(root: Path) -> Pointer:
    """CURRENT's name and its file's identity (inode, mtime, ctime, size; of a symbolic link's target too): written
    again with the same name, it is a new publish (a repaired version: ``echo V > OUT/CURRENT``).

    NOTE: the ctime and the link's target: a CURRENT written again in place with its old mtime put back (``cp -p``,
    ``rsync -t --inplace``, ``touch -d``), or a link whose target file was written again, was not seen"""
    stamp: tuple[int, ...] | None = ()
    for follow in (False, True):
        try:
            st = os.stat(root / "CURRENT", follow_symlinks=follow)
        except OSError:
            stamp = None if not follow else stamp
            break
        stamp = (*(stamp or ()), st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        if not stat.S_ISLNK(st.st_mode):
            break
    return current_pointer(root), stamp


def _first_seen(root: Path, live: str) -> Pointer:
    """The pointer the follower starts from: CURRENT now if it names ``live`` (or nothing: a version directory
    served, CURRENT gone), else one no state equals, so that the first check acts on what CURRENT names.

    NOTE: ``live`` is the version CURRENT named before the model loaded (minutes on CUDA); a re-index published
    meanwhile, taken for the state acted on, was never followed (until CURRENT changed again)."""
    state = _pointer_state(root)
    return state if state[0] in (None, live) else (live, None)


class IndexFollower:
    """The live ``SearchIndex`` of OUT, replaced when a compatible new version is published."""

    def __init__(self, root: Path, spec: ModelSpec | None, live: SearchIndex, metrics: ServeMetrics,
                 nprobe: int | None = None, rescore: int | None = None,
                 prepare: Callable[[IndexReader], None] | None = None, retry_first_s: float = RETRY_FIRST_S,
                 query_prompt_fixed: bool = False) -> None:
        """``spec``: the model the server embeds queries with; ``None`` for an index of precomputed vectors
        (``--vectors-column``), whose new versions must be of precomputed vectors too, of the same dim, metric and
        stored format. ``query_prompt_fixed``: the server was given its query prompt (``--query-prompt``), so what
        a version records is not compared."""
        self.root = Path(root)
        self.query_prompt_fixed = query_prompt_fixed
        self.prepare = prepare  # run on a compatible new version before it serves (its GPU copy)
        self.spec = spec
        self.live = live
        self.metrics = metrics
        self.nprobe = nprobe
        self.rescore = rescore
        self.refused: Refusal | None = None
        self._seen: Pointer = _first_seen(self.root, live.version)  # the pointer last acted on
        self._lock = threading.Lock()  # one load at a time
        self.retry_first_s = retry_first_s
        self._retry_delay_s = retry_first_s  # the wait before the next try of a transient refusal
        self._retry_at: float | None = None  # when the refused version named by CURRENT is tried again
        self._retired: list[weakref.ref[SearchIndex]] = []  # versions swapped out, until they are freed
        self._retired_lock = threading.Lock()  # (appended on the reload thread, read on the event loop)
        self._collect_delay_s = COLLECT_FIRST_S
        self._collect_at = 0.0
        metrics.serving(live.version, live.reader.ntotal)

    def status(self, live: SearchIndex | None = None) -> dict[str, Any]:
        """``/ready``'s version, vectors and refusal, of ``live`` (the live version, read once by the caller).

        NOTE: a version is swapped in on the reload thread: ``self.live`` read twice could give one version's name
        and the next one's vector count"""
        live = self.live if live is None else live
        refused = self.refused
        out: dict[str, Any] = {"version": live.version, "vectors": live.reader.ntotal}
        if refused is not None:
            out["refused"] = refused.as_dict()
        return out

    def due(self) -> bool:
        """Whether ``check_once`` has something to do: CURRENT changed (or was written again), or a refused
        version's retry is due."""
        return _pointer_state(self.root) != self._seen or self._retry_due()

    def _retry_due(self) -> bool:
        return self._retry_at is not None and time.monotonic() >= self._retry_at

    def check_once(self) -> bool:
        """Load and swap in a newly published version (blocking). True when the live version changed."""
        with self._lock:
            state = _pointer_state(self.root)
            if state == self._seen and not self._retry_due():
                return False
            if state != self._seen:  # published (or CURRENT written again): a first try, whatever came before
                self._retry_delay_s = self.retry_first_s
            self._seen = state
            self._retry_at = None
            pointer = state[0]
            if pointer is None:
                self._refuse("", "current", _no_pointer(self.root))
                return False
            if not VERSION_RE.match(pointer):
                # NOTE: no version to open, now or later: said once, not tried again (a retry reads the same bytes);
                # the next write of CURRENT is a new publish, seen at the next check (--reload-interval-s)
                why = _not_a_version(self.root)
                if why is not None:  # (None: CURRENT was written again meanwhile: the next check reads it)
                    self._refuse(shown(pointer), "current", why)
                return False
            try:
                published = _published_manifest(self.root)
            except MislabeledVersion as exc:  # NOTE: was taken for the version its manifest names (v3 served as v2)
                self._refuse(pointer, "version", str(exc))
                return False
            if published is not None and published.version == self.live.version:  # CURRENT went back to it
                self._back_to_live()  # NOTE: not loaded again beside itself to learn that
                return False
            if published is not None:
                # NOTE: refused on its manifest before it is loaded: a version of another model, metric or transform
                # was read whole (an unsealed one hashed) beside the live one first, and one too large for that was
                # an 'open' refusal (out of memory) tried again every minute, never saying why it could not serve
                early = self._refusal(published, None)
                if early is not None:
                    self._refuse(published.version, *early)
                    return False
            try:
                reader = IndexReader(self.root, nprobe=self.nprobe, rescore=self.rescore)
            except MemoryError:
                self._out_of_memory(shown(pointer))
                return False
            except MislabeledVersion as exc:  # (the directory replaced since its manifest was read)
                self._refuse(pointer, "version", str(exc))
                return False
            except (PetalError, OSError, RuntimeError, KeyError, ValueError) as exc:
                # NOTE: tried again, whatever the error: a version copied in by hand may still be arriving, a
                # network filesystem may hiccup; opening costs the cheap checks only (O(1) in the index size)
                self._refuse(shown(pointer), "open", f"cannot open {shown(pointer)}: {exc}", retry=True)
                return False
            if reader.manifest.version == self.live.version:  # CURRENT went back to the live version
                self._back_to_live()
                return False
            try:
                candidate_or_why = self._compatible(reader)
            except MemoryError:
                self._out_of_memory(reader.manifest.version)
                return False
            if not isinstance(candidate_or_why, SearchIndex):
                self._refuse(reader.manifest.version, *candidate_or_why)
                return False
            candidate = candidate_or_why
            try:
                # NOTE: held while it serves (a prune leaves it on disk), released when the version is freed
                held = lease(candidate.reader.dir)
            except OSError as exc:  # pruned since it opened (CURRENT names a newer one): tried again
                self._refuse(candidate.version, "open", f"cannot open {candidate.version}: {exc}", retry=True)
                return False
            if self.prepare is not None:
                try:
                    self.prepare(candidate.reader)
                except Exception as exc:  # e.g. out of GPU memory: the old version keeps serving; tried again
                    held.release()
                    if isinstance(exc, OpenFailed):  # a file of the version found damaged when read in full
                        self._refuse(candidate.version, "open", f"cannot open {candidate.version}: {exc}", retry=True)
                    else:
                        self._refuse(candidate.version, "prepare", f"cannot prepare {candidate.version}: {exc}",
                                     retry=True)
                    return False
            release_with(candidate, held)
            old = self.live.version
            with self._retired_lock:
                self._retired.append(weakref.ref(self.live))
                self._collect_delay_s = COLLECT_FIRST_S
                self._collect_at = time.monotonic() + COLLECT_FIRST_S
            self.refused = None  # NOTE: before the swap: /ready never says the version it serves was refused
            self.swap_to(candidate)  # NOTE: the swap; searches holding the old object finish on it
            self.metrics.index_reloads.labels(result="loaded").inc()
            log.info("petal serve: now serving %s (%d vectors), was %s", candidate.version,
                     candidate.reader.ntotal, old)
            # NOTE: the server's --nprobe/--rescore that this version's index has no use for (a re-index turned IVF
            # into HNSW or Flat), said as the start says them for the first version; they were dropped in silence
            for note in candidate.reader.ignored:
                log.warning("petal serve: note: %s (%s)", note, candidate.version)
            return True

    def swap_to(self, candidate: SearchIndex) -> None:
        """Serve ``candidate`` from now on: the live version and its gauges (the refusal's series cleared too) set
        together, under the metrics' swap lock, so a scrape (``ServeState.metrics_body``) sees the one or the other."""
        with self.metrics.swapping():
            self.live = candidate
            self.metrics.serving(candidate.version, candidate.reader.ntotal)

    def _back_to_live(self) -> None:
        """CURRENT names the live version again: a refusal before is over (said once in the log: its last line was
        'refused X, still serving Y', though /ready and the metric no longer said so)."""
        if self.refused is not None:
            log.warning("petal serve: CURRENT names %s again, the version it serves; the refusal of %s is over",
                        self.live.version, self.refused.version or "CURRENT")
        self.refused = None
        self.metrics.index_refused.clear()

    def _out_of_memory(self, version: str) -> None:
        """A version that does not fit in memory beside the live one: refused, tried again (memory may free up).

        NOTE: a MemoryError was no refusal: a traceback in the log, nothing in /ready or the metrics, and the version
        was never tried again (CURRENT counted as acted on)"""
        self._refuse(version, "open", f"cannot open {version}: out of memory (it is loaded beside the live version, "
                                      f"{self.live.version}, until it replaces it)", retry=True)

    def _compatible(self, reader: IndexReader) -> SearchIndex | tuple[str, str]:
        """``reader`` as a ``SearchIndex`` for the served model, or why not: (reason, message), never retried."""
        why = self._refusal(reader.manifest, reader.dim)  # (again: CURRENT may have moved since it was read)
        if why is not None:
            return why
        if self.spec is None:
            candidate = SearchIndex.from_reader(reader, None)
            return self._format_change(candidate.version, candidate.transform) or candidate
        try:
            return SearchIndex.from_reader(reader, self.spec)
        except ConfigError as exc:  # the same model: its vectors went through another transform
            return "output", f"{reader.manifest.version} was built with another output transform ({exc})"

    def _refusal(self, manifest: Manifest, dim: int | None) -> tuple[str, str] | None:
        """Why the version of ``manifest`` cannot replace the live one, (reason, message), from what its manifest
        records; ``dim``: the width of its opened index (``None``: not opened yet, checked once it is).

        NOTE: the model is compared before the dims: a version of another model of another dim (a re-index with
        --model) is a "model" refusal, not an "open" error tried again every minute"""
        if self.spec is None:
            return self._vectors_refusal(manifest, dim)
        version = manifest.version
        if manifest.precomputed:
            return "model", (f"{version} was built from precomputed vectors (--vectors-column), without a model; the "
                             f"server embeds text queries with {self.live.version}'s model (serve that index with a "
                             "server of its own)")
        mismatch = model_mismatch(manifest, self.spec)
        if mismatch:
            return "model", f"{version} was built with another model ({mismatch})"
        metric = self._metric_change(manifest)
        if metric is not None:
            return "metric", metric
        if manifest.max_length != self.spec.pooling.max_length:
            return "max_length", (f"{version} was built with max length {manifest.max_length}, "
                                  f"the server embeds at {self.spec.pooling.max_length}")
        # calibration may differ: each version keeps its own
        output = self._format_change(version, manifest.transform(self.spec))
        if output is not None:
            return output
        recorded = _query_prompt(manifest)
        # NOTE: a prompt given to the server (--query-prompt) is used whatever a version records, as it was for
        # the first version; without one the server uses the prompt the first version recorded
        if not self.query_prompt_fixed and recorded is not None and recorded != self.spec.prompts.query:
            return "prompt", (f"{version} records query prompt {recorded!r}, the server embeds queries "
                              f"with {self.spec.prompts.query!r} (the prompt of the version it started on; "
                              "restart it, or give it --query-prompt)")
        return None

    def _vectors_refusal(self, manifest: Manifest, dim: int | None) -> tuple[str, str] | None:
        """A new version of an index of precomputed vectors: clients send rows in its space, so it must be of
        precomputed vectors too (no model), of the same dim, metric and stored format (quantization, ...)."""
        live = self.live.reader.manifest
        version = manifest.version
        if not manifest.precomputed:
            return "model", (f"{version} was built with a model ({manifest.model.display}); the server serves "
                             f"{live.version}, an index of precomputed vectors, to clients that send vectors (restart "
                             "it to serve this version and its text queries)")
        # (the widths the manifests record until the index is open, then the index's own)
        width, served = (manifest.dim, live.dim) if dim is None else (dim, self.live.reader.dim)
        if width != served:
            return "output", (f"{version} holds vectors of dim {width}, the server serves dim {served} "
                              f"({live.version}): its clients' vectors would not fit")
        metric = self._metric_change(manifest)
        if metric is not None:
            return "metric", metric
        if manifest.output is not None:  # (else the stored format is known once the index is open)
            return self._format_change(version, manifest.output)
        return None

    def _format_change(self, version: str, transform: OutputTransform) -> tuple[str, str] | None:
        """Why a version whose vectors went through ``transform`` (how they are stored) is refused (``None``: the
        live version's format)."""
        new, live = StoredFormat.of(transform), StoredFormat.of(self.live.transform)
        if (transform.model_dim, new) == (self.live.transform.model_dim, live):
            return None
        if self.spec is None:
            return "output", f"{version} stores its vectors in another format ({new.to_dict()} vs {live.to_dict()})"
        return "output", f"{version} was built with another output transform ({new.to_dict()} vs {live.to_dict()})"

    def _metric_change(self, manifest: Manifest) -> str | None:
        """Why a new version searched by another metric is refused (``None``: the same metric), for every kind of
        index: clients read its scores (and ``petal rebuild --metric`` changes nothing else)."""
        live = self.live.reader.manifest
        if manifest.metric == live.metric:
            return None
        return (f"{manifest.version} is searched by metric {manifest.metric}, the server serves {live.metric} "
                f"({live.version}): scores would change meaning (restart the server to serve it)")

    def _refuse(self, version: str, reason: str, message: str, retry: bool = False) -> None:
        retry_in_s = None
        if retry:
            retry_in_s = self._retry_delay_s
            self._retry_at = time.monotonic() + retry_in_s
            self._retry_delay_s = min(RETRY_MAX_S, 2 * self._retry_delay_s)
        message = one_line(message)  # NOTE: what a version's files or CURRENT hold is quoted there; this is the guard
        self.refused = Refusal(version, reason, message, retry_in_s)
        self.metrics.refused(version, reason)
        self.metrics.index_reloads.labels(result="refused").inc()
        again = f" (trying again in {retry_in_s:g} s)" if retry_in_s is not None else ""
        log.warning("petal serve: refused %s, still serving %s: %s%s", version or "CURRENT", self.live.version,
                    message, again)

    def collect_retired(self) -> None:
        """Free the versions swapped out that only a reference cycle still holds, 1, 2, 4 ... s (at most 60 s apart)
        after the swap while one is alive (one a long search still holds is freed when it ends, as any other).

        NOTE: a request that failed on a version (a 'where' naming no column, refused on the search thread; a text over
        the token limit, on the engine thread) left its error's traceback, whose frames hold the request and its
        version, in a cycle with the future that carried it: freed by a full collection only, which an idle server
        may never run, so the old version stayed loaded and leased (a --keep-versions 1 run kept it) indefinitely"""
        with self._retired_lock:
            self._retired = [ref for ref in self._retired if ref() is not None]
            if not self._retired or time.monotonic() < self._collect_at:
                return
        gc.collect()
        with self._retired_lock:
            self._retired = [ref for ref in self._retired if ref() is not None]
            self._collect_delay_s = min(RETRY_MAX_S, 2 * self._collect_delay_s)
            self._collect_at = time.monotonic() + self._collect_delay_s

    async def follow(self, interval_s: float) -> None:
        """Poll forever (cancel to stop); loading runs in a thread, off the event loop."""
        while True:
            await asyncio.sleep(interval_s)
            fault("serve_follow")
            self.collect_retired()
            if self.due():
                try:
                    await _in_daemon_thread(self.check_once)
                except Exception:  # a bug must not stop the following: log it, try the next change
                    log.exception("petal serve: checking %s for a new version failed", self.root)


async def _in_daemon_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a thread of its own. NOTE: not ``asyncio.to_thread``: the loop's default executor is joined
    when the server exits, so a SIGTERM during a reload (the sha256 of a large version's files: minutes)
    would wait for it, past --drain-timeout-s; a daemon thread is left behind."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # cancelled: the server is stopping
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as exc:
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="petal-reload", daemon=True).start()
    return await future


def _published_manifest(root: Path) -> Manifest | None:
    """The manifest of the version ``root``'s CURRENT names (a small file), or ``None`` where it cannot be read
    (opening the version says why); one whose directory's manifest records another version: ``MislabeledVersion``."""
    try:
        return resolve_index_dir(root)[1]
    except MislabeledVersion:
        raise
    except (PetalError, OSError, ValueError, KeyError, TypeError, MemoryError):
        return None


def _not_a_version(root: Path) -> str | None:
    """Why ``root``'s CURRENT names no version (``OutputDir.current_version``'s message: what it holds, the versions
    that open, how to repair it); ``None`` when it names one now (written again meanwhile)."""
    try:
        OutputDir(root).current_version()
    except PetalError as exc:
        return str(exc)
    return None


def _no_pointer(root: Path) -> str:
    """Why ``root``'s CURRENT names nothing, as ``petal query OUT`` says it: a symbolic link out of OUT or to nothing, a
    directory or FIFO, empty, unreadable, or missing.

    NOTE: every such CURRENT was 'missing, empty or cannot be read' in /ready, where the CLI names what it is; OUT
    itself removed was 'OUT/CURRENT is missing', where the CLI says OUT is not a petal index"""
    current = root / "CURRENT"
    if not os.path.isdir(root):
        return str(not_an_index(root))
    why = _not_a_version(root)
    if why is not None:
        return why
    if os.path.islink(current):
        try:
            target = quote_text(os.readlink(current), SHOWN_POINTER_CHARS)
        except OSError:
            target = "?"
        return f"{quote_path(current)} is a symbolic link to nothing ({target}); it should name a version"
    return f"{quote_path(current)} is missing (it should name a version)"


def _query_prompt(manifest: Manifest) -> str | None:
    """The query prompt recorded at index time (none for an index of precomputed vectors)."""
    return manifest.model.query_prompt if isinstance(manifest.model, ModelRecord) else None
