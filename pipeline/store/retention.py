"""Which store entries a clean-up keeps: those some version on disk uses (README: petal deletes store entries no
version uses).

Every version left in ``OUT/versions/`` is a way back (``echo vOLD > OUT/CURRENT``): the versions
``--keep-versions`` keeps, one a reader holds a lease on (pruning leaves it, pipeline/layout.py), one newer than
the live one that a reader still holds. Each must stay usable as the live version, so ``petal rebuild`` and an
additive ``petal index`` run need the store entries its manifest names (the shards it kept are read from them);
an entry is deleted only once no version on disk names it. Versions are pruned first, so the entries of a pruned
version go in the same clean-up.
"""

from __future__ import annotations

from pathlib import Path

from petal.pipeline.layout import OutputDir, read_manifest
from petal.pipeline.manifest import MANIFEST_FILE
from petal.pipeline.reliability.errors import PetalError
from petal.pipeline.store.embeddings import EmbeddingStore, shard_key, warn
from petal.pipeline.store.side_files import prune_side_files


def entries_in_use(out: OutputDir, store: EmbeddingStore) -> set[Path]:
    """The entry directories (``OUT/store/shards/<shard key>/<fingerprint>``) the shards of every version in
    ``OUT/versions/`` were built from. A manifest petal cannot read raises a ``PetalError`` naming it (78, 66):
    what that version uses is unknown."""
    used: set[Path] = set()
    for version in out.versions():
        manifest = read_manifest(out.version_dir(version) / MANIFEST_FILE, out.root)
        used.update(store.shards_dir / shard_key(shard.abs_path) / shard.entry for shard in manifest.shards)
    return used


def prune_unused(out: OutputDir, store: EmbeddingStore, also: set[Path]) -> int:
    """Delete the store entries (and their side files: tombstones, stored columns) that no version on disk uses
    and that are not in ``also`` (the run's own), and every committed range. Returns how many entries.

    When what a version uses cannot be read (its manifest unreadable or damaged), no entry is deleted: said on
    stderr, and the next run tries again (a version pruned or repaired by then no longer stands in the way)."""
    try:
        keep = entries_in_use(out, store) | also
    except PetalError as exc:
        warn(f"kept every store entry, as one may belong to a version on disk: {exc}")
        return 0
    removed = store.prune(keep)
    prune_side_files(store.root, keep, store.left)
    return removed
