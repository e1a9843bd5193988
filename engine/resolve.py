"""Where a model lives: a local directory, or a Hugging Face model id already in the local cache.

petal never downloads. An id (``org/name``) resolves to the snapshot the cache's ``refs/main``
names in the first cache directory that has it: ``$HF_HUB_CACHE``, ``$HF_HOME/hub``,
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
        ref = repo / "refs" / "main"
        if ref.is_file():
            snapshot = snapshots / ref.read_text(encoding="utf-8").strip()
            if snapshot.is_dir():
                return snapshot, looked
        found = sorted(p for p in snapshots.iterdir() if p.is_dir())
        if len(found) == 1:
            return found[0], looked
        if found:  # several revisions and no refs/main: refuse to pick one
            names = ", ".join(p.name[:12] for p in found)
            raise LookupError(f"{repo} holds several snapshots ({names}) and no refs/main; pass the snapshot "
                              "directory you want as --model")
    return None, looked
