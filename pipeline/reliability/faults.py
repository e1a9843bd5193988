"""Named fault points: where a crash, an error or a full disk is injected to test recovery.

``fault("after_shard_commit")`` does nothing unless the environment arms that point::

    PETAL_FAULT="after_shard_commit:2:kill"              the 2nd time the point is reached, SIGKILL itself
    PETAL_FAULT="read_batch:3+:eio,after_lock:1:sleep=2"  from the 3rd hit on, every hit; several points

Actions: ``kill`` (SIGKILL, no cleanup), ``term``/``int`` (send SIGTERM/SIGINT to itself),
``raise`` (an unexpected exception: exit 1), ``sleep=S``, ``enospc`` and ``eio`` (an ``OSError``
naming the path the point is about to write or read), ``oom`` (``torch.OutOfMemoryError``), ``nomem``
(a host ``MemoryError``) and ``cuda`` (a fatal CUDA error). ``PETAL_FAULT_TRACE=FILE`` appends every
point reached to FILE, so a test can prove its scenario reaches every point below.

NOTE: test-only. Nothing is armed unless ``PETAL_FAULT`` is set; an unknown point or action in it is
an error, so a typo never silently disarms a test.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

FAULT_ENV = "PETAL_FAULT"
TRACE_ENV = "PETAL_FAULT_TRACE"

# Every fault point, in the order a run reaches them, and what has happened when it fires.
FAULT_POINTS: dict[str, str] = {
    "read_footer": "about to read a shard's footer (preflight)",
    "after_preflight": "footers, model config and output directory checked; no lock yet",
    "after_lock": "writer lock held; nothing cleaned or written yet",
    "read_content": "about to read a whole shard to hash its content (its fingerprint in the store)",
    "after_model_load": "engine created, before the first shard is read (a worker's: before it reports ready)",
    "read_batch": "about to decode a record batch of a shard",
    "engine_step": "about to run one engine step",
    "after_batch": "a step's results handed to the store (a batch boundary)",
    "store_entry_open": "about to allocate a shard's embeddings file in store/tmp",
    "store_commit_begin": "a shard is complete: about to flush and write its entry in store/tmp",
    "store_commit_mid": "embeddings and rows written, rejects and entry.json not yet",
    "store_commit_rename": "entry complete and fsynced in store/tmp, not yet renamed into the store",
    "store_committed": "an entry renamed into the store, not yet reported (a worker's commit event comes after)",
    "after_shard_commit": "a shard's entry is committed (renamed into the store)",
    "before_index_build": "every shard committed; about to build the index in a staging directory",
    "after_index_build": "index.faiss and ids.parquet staged; rejects and manifest not yet",
    "tombstones_staged": "--delete's tombstones staged beside the store (in force once CURRENT names the version)",
    "before_version_rename": "staging directory complete and fsynced, not yet renamed to versions/<id>",
    "before_current_swap": "versions/<id> in place, CURRENT still names the previous version",
    "after_publish": "CURRENT names the new version; nothing pruned yet",
    "store_prune": "deleting a store entry no version uses",
    "version_prune": "deleting a superseded version",
}
# Reached by readers (``petal query``/``info``/``verify``), not by ``petal index``: a sleep here widens the window in
# which a writer can publish and prune the version a reader has just resolved.
QUERY_FAULT_POINTS: dict[str, str] = {
    "query_open": "CURRENT resolved to a version; its files not yet opened",
}
# Reached by ``petal serve``'s engine and search threads and its version follower: a ``raise`` here is a bug past
# every per-request guard, which must stop the server (exit 1) rather than leave a dead thread behind an open port.
SERVE_FAULT_POINTS: dict[str, str] = {
    "serve_engine_batch": "the engine thread took queued texts off the queue; not yet tokenized",
    "serve_search_batch": "the search thread took queued searches off the queue; not yet searched",
    "serve_follow": "the version follower woke to look at CURRENT (each --reload-interval-s)",
}
# Reached by the worker processes of ``--workers``/``--devices`` only (a run in one process has none).
WORKER_FAULT_POINTS: dict[str, str] = {
    "worker_start": "a worker process began its worker_main; its engine not loaded yet",
}
_KNOWN = (*FAULT_POINTS, *QUERY_FAULT_POINTS, *SERVE_FAULT_POINTS, *WORKER_FAULT_POINTS)
ACTIONS = ("kill", "term", "int", "raise", "sleep", "enospc", "eio", "oom", "nomem", "cuda")


class InjectedFault(RuntimeError):
    """The ``raise`` action: stands for any unexpected exception (a bug; exit 1)."""


@dataclass(frozen=True)
class Arm:
    point: str
    first_hit: int  # 1-based
    repeat: bool  # every hit from ``first_hit`` on
    action: str
    seconds: float = 0.0  # for ``sleep``

    def fires(self, hit: int) -> bool:
        return hit >= self.first_hit if self.repeat else hit == self.first_hit


def parse(spec: str) -> list[Arm]:
    """``point:N[+]:action[=arg]`` items separated by commas. Raises ``ValueError`` on any mistake."""
    arms = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        try:
            point, when, action = item.split(":")
            first = int(when.rstrip("+"))
        except ValueError as exc:
            raise ValueError(f"{FAULT_ENV} item {item!r} is not point:N[+]:action") from exc
        name, _, arg = action.partition("=")
        if point not in _KNOWN:
            raise ValueError(f"{FAULT_ENV}: unknown fault point {point!r} (known: {', '.join(_KNOWN)})")
        if name not in ACTIONS or (name == "sleep") != bool(arg) or first < 1:
            raise ValueError(f"{FAULT_ENV}: bad action or hit in {item!r} (actions: {', '.join(ACTIONS)}; sleep=S)")
        arms.append(Arm(point, first, when.endswith("+"), name, float(arg or 0)))
    return arms


class _Armed:
    """The parsed spec and hit counters; re-read when the environment changes (forked test runners)."""

    def __init__(self) -> None:
        self.spec: str | None = None
        self.arms: list[Arm] = []
        self.hits: dict[str, int] = {}

    def refresh(self) -> None:
        spec = os.environ.get(FAULT_ENV, "")
        if spec != self.spec:
            self.spec, self.arms, self.hits = spec, parse(spec), {}


_ARMED = _Armed()


def fault(point: str, path: Path | str | None = None) -> None:
    """Reach fault point ``point`` (about to touch ``path``, if any); fires when the environment arms it."""
    assert point in _KNOWN, point
    trace = os.environ.get(TRACE_ENV)
    if trace:
        fd = os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{point}\n".encode())
        finally:
            os.close(fd)
    if not os.environ.get(FAULT_ENV):
        return
    _ARMED.refresh()
    hit = _ARMED.hits[point] = _ARMED.hits.get(point, 0) + 1
    for arm in _ARMED.arms:
        if arm.point == point and arm.fires(hit):
            _fire(arm, hit, path)


def _fire(arm: Arm, hit: int, path: Path | str | None) -> None:
    where = f"fault {arm.point} #{hit}"
    if arm.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # NOTE: never returns; the signal is delivered before the sleep ends
    elif arm.action in ("term", "int"):
        os.kill(os.getpid(), signal.SIGTERM if arm.action == "term" else signal.SIGINT)
    elif arm.action == "sleep":
        time.sleep(arm.seconds)
    elif arm.action == "raise":
        raise InjectedFault(f"injected {where}")
    elif arm.action in ("enospc", "eio"):
        code = errno.ENOSPC if arm.action == "enospc" else errno.EIO
        raise OSError(code, os.strerror(code), str(path) if path is not None else where)
    elif arm.action == "oom":
        import torch

        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (injected {where})")
    elif arm.action == "nomem":
        raise MemoryError(f"injected {where}")
    elif arm.action == "cuda":
        import torch

        raise torch.AcceleratorError(f"CUDA error: an illegal memory access was encountered (injected {where})")
