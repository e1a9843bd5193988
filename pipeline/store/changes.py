"""What changed in the input since the live version: shards added, changed, removed, unchanged."""

from __future__ import annotations

from petal.pipeline.ingest.parquet import ShardInfo
from petal.pipeline.layout import OutputDir
from petal.pipeline.manifest import Manifest, shard_names
from petal.pipeline.reliability.errors import PetalError


def live_manifest(out: OutputDir) -> Manifest | None:
    """The live version's manifest; ``None`` when there is none or it cannot be read (``--full``)."""
    try:
        return out.current_manifest()
    except PetalError:
        return None


def shard_changes(previous: Manifest | None, shards: list[ShardInfo], sha256: list[str],
                  kept: frozenset[str] = frozenset()) -> dict[str, list[str]]:
    """Compare the shards of this run (``sha256[i]`` is the content hash of ``shards[i]``) with the
    previous manifest's shard list, by absolute path and content; the shards whose absolute path is in ``kept``
    (kept from the live version, not named) are listed under ``kept`` (the key only when there are some) rather than
    ``unchanged``. Paths as the user gave them, but a given path that stands for two of these shards (a symbolic
    link switched to another file since a run read it) is said as each one's absolute path."""
    before = {s.abs_path: s for s in (previous.shards if previous is not None else ())}
    named = {info.abs_path for info in shards}
    removed = [s for s in before.values() if s.abs_path not in named]
    names = shard_names([*((str(info.path), info.abs_path) for info in shards),
                         *((s.path, s.abs_path) for s in removed)])
    changes: dict[str, list[str]] = {"added": [], "changed": [], "removed": names[len(shards):], "unchanged": []}
    if kept:  # NOTE: the key is there only when shards were kept (the report's shape is a contract)
        changes["kept"] = []
    for info, digest, name in zip(shards, sha256, names):
        old = before.get(info.abs_path)
        kind = "kept" if info.abs_path in kept else "added" if old is None else \
            "unchanged" if old.sha256 == digest else "changed"
        changes[kind].append(name)
    return changes
