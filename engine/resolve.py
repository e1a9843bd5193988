"""Where a model lives: a local directory, or a Hugging Face model id already in the local cache.

petal never downloads. An id (``org/name``) resolves to the snapshot the cache's ``refs/main``
names (only that one) in the first cache directory that has it: ``$HF_HUB_CACHE``, ``$HF_HOME/hub``,
``~/.cache/huggingface/hub`` (the layout ``huggingface_hub`` writes).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

HF_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


def hf_cache_dirs() -> list[Path]:
    """The Hugging Face hub cache directories to look in, in order, without duplicates: the one ``huggingface_hub``
    writes first (``$HF_HUB_CACHE``, the older ``$HUGGINGFACE_HUB_CACHE``, ``$HF_HOME/hub``,
    ``$XDG_CACHE_HOME/huggingface/hub``), then ``~/.cache/huggingface/hub``; ``~`` and ``$VARS`` expanded as it does."""
    env = {name: os.path.expandvars(os.environ.get(name, "")) for name in
           ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")}
    candidates = [Path(env[name]) for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE") if env[name]]
    candidates += [Path(env["HF_HOME"]) / "hub"] if env["HF_HOME"] else []
    candidates += [Path(env["XDG_CACHE_HOME"]) / "huggingface" / "hub"] if env["XDG_CACHE_HOME"] else []
    candidates.append(Path.home() / ".cache" / "huggingface" / "hub")
    out: list[Path] = []
    for path in candidates:
        path = path.expanduser()
        if path not in out:
            out.append(path)
    return out


def cached_model_id(path: Path) -> str | None:
    """The model id whose cached snapshot ``path`` is (``.../models--org--name/snapshots/REV`` -> ``org/name``), or
    ``None`` for any other directory."""
    repo = path.parent.parent.name
    if path.parent.name != "snapshots" or not repo.startswith("models--") or len(repo) == len("models--"):
        return None
    return repo[len("models--"):].replace("--", "/")


def cached_snapshot(model_id: str, cache_dirs: list[Path]) -> tuple[Path | None, list[str]]:
    """The cached snapshot of ``model_id`` (``None`` if absent) and what was looked at (for the error)."""
    looked: list[str] = []
    folder = "models--" + model_id.replace("/", "--")
    for cache in cache_dirs:
        repo = cache / folder
        looked.append(str(repo))
        snapshots = repo / "snapshots"
        if not snapshots.is_dir():
            continue
        snapshot = _snapshot_of(repo, snapshots)
        if snapshot is not None:
            return snapshot, looked
    return None, looked


def _snapshot_of(repo: Path, snapshots: Path) -> Path | None:
    """The snapshot ``refs/main`` names, as ``huggingface_hub`` resolves revision ``main`` offline: only that one.

    A ``refs/main`` naming a snapshot that is not there is a ``LookupError`` (78) naming it. Without a ``refs/main``
    (a revision fetched by its commit hash writes none), the one snapshot there; several: ``LookupError``, none is
    picked. Neither a ref nor a snapshot: ``None`` (the next cache directory is looked in)."""
    # NOTE: a refs/main naming a missing snapshot fell through to "the one snapshot present", which loaded another
    # revision than the one refs/main names, at exit 0
    ref = repo / "refs" / "main"
    found = sorted(p for p in snapshots.iterdir() if p.is_dir())
    held = f"{snapshots} holds {', '.join(p.name[:12] for p in found)}" if found else f"{snapshots} is empty"
    if not ref.is_file():
        if len(found) <= 1:
            return found[0] if found else None
        raise LookupError(f"{repo} has no refs/main and several snapshots ({held}); pass the snapshot directory you "
                          "want as --model")
    name = _snapshot_name(ref, snapshots)
    snapshot = snapshots / name
    if not snapshot.is_dir():
        raise LookupError(f"{ref} names snapshot {name!r}, which is not in {snapshots} ({held}): the cache is "
                          "incomplete; fetch that revision again, or pass the snapshot directory you want as --model")
    return snapshot


REF_BYTES = 1024  # a ref holds a commit hash (40 characters): more is no ref, and is never read whole


def _snapshot_name(ref: Path, snapshots: Path) -> str:
    """The snapshot ``ref`` (``refs/main``) names: one directory name of ``snapshots``, read without taking more
    than ``REF_BYTES`` (non-blocking: a FIFO swapped in after ``is_file`` is never waited on). A name that leaves
    the cache (``../..``, an absolute path: that directory was loaded), that is not text or that is too long (a
    1 GB file was read whole) is a ``LookupError`` naming the file (78)."""
    fd = os.open(ref, os.O_RDONLY | os.O_NONBLOCK)  # NOTE: an OSError goes up naming it (denied 66, EIO 74)
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(REF_BYTES + 1)
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise LookupError(f"{ref} is not text ({exc}); huggingface_hub writes a commit hash there") from exc
    if len(raw) > REF_BYTES or not name or name in (".", "..") or any(c in name for c in "/\\\0"):
        shown = repr(name[:60]) + ("..." if len(name) > 60 else "")
        raise LookupError(f"{ref} holds {shown}, which is not the name of a snapshot in {snapshots} (huggingface_hub "
                          "writes a commit hash there); fix or remove it, or pass the snapshot directory as --model")
    return name
