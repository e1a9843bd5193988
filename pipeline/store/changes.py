"""What changed in the input since the live version: shards added, changed, removed, unchanged."""

from __future__ import annotations

from petal.pipeline.ingest.parquet import ShardInfo
from petal.pipeline.layout import OutputDir
from petal.pipeline.manifest import Manifest
from petal.pipeline.reliability.errors import PetalError


def live_manifest(out: OutputDir) -> Manifest | None:
    """The live version's manifest; ``None`` when there is none or it cannot be read (``--full``)."""
    try:
        return out.current_manifest()
    except PetalError:
        return None


def shard_changes(previous: Manifest | None, shards: list[ShardInfo], sha256: list[str]) -> dict[str, list[str]]:
    """Compare the shards of this run (``sha256[i]`` is the content hash of ``shards[i]``) with the
    previous manifest's shard list, by absolute path and content. Paths as the user gave them."""
    before = {s.abs_path: s for s in (previous.shards if previous is not None else ())}
    changes: dict[str, list[str]] = {"added": [], "changed": [], "removed": [], "unchanged": []}
    for info, digest in zip(shards, sha256):
        old = before.pop(info.abs_path, None)
        kind = "added" if old is None else "unchanged" if old.sha256 == digest else "changed"
        changes[kind].append(str(info.path))
    changes["removed"] = [s.path for s in before.values()]
    return changes
