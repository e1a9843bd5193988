"""Files the store keeps about a committed entry, outside it (an entry is never modified after commit):

```
OUT/store/deleted/<shard key>/<fingerprint>.parquet   tombstones: rows removed by --delete (tombstones.py)
OUT/store/columns/<shard key>/<fingerprint>.parquet   stored text and --keep-columns (columns.py)
OUT/store/published/<shard key>/<fingerprint>          empty: a version on disk used the entry (retention.py)
```

They live and go with their entry: ``prune_side_files`` removes those of entries no longer kept.
"""

from __future__ import annotations

from pathlib import Path

from petal.pipeline.reliability.leftovers import leave, remove_or_leave

PUBLISHED_TREE = "published"
SIDE_TREES = ("deleted", "columns", PUBLISHED_TREE)
KEY_TREES = ("shards", "parts", *SIDE_TREES)  # the store's directories that hold one directory per shard key


def real_dirs(root: Path, left: list[dict[str, str]] | None = None) -> list[Path]:
    """The directories in ``root`` a walk of the store may enter and delete under, sorted: never a symbolic link (its
    target may lie anywhere, outside OUT too) nor a file; none when ``root`` itself is not a real directory, or one
    petal may not list (as a glob skips it: the reads that need it name it; a clean-up's ``left`` gets it, said)."""
    if root.is_symlink() or not root.is_dir():
        return []
    try:
        return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError as exc:
        if left is not None:
            leave(root, "a store directory", f"cannot list it: {exc.strerror or exc}", left)
        return []


def side_file(entry_dir: Path, tree: str) -> Path:
    """``OUT/store/<tree>/<shard key>/<fingerprint>.parquet`` for the entry in ``OUT/store/shards/<key>/<fp>`` (no
    suffix in ``published``)."""
    store_root = entry_dir.parent.parent.parent
    suffix = "" if tree == PUBLISHED_TREE else ".parquet"  # NOTE: a marker, no Parquet file
    return store_root / tree / entry_dir.parent.name / f"{entry_dir.name}{suffix}"


def prune_side_files(store_root: Path, keep: set[Path], left: list[dict[str, str]] | None = None) -> int:
    """Remove side files (and leftovers of interrupted writes) whose entry is not in ``keep``. Returns how many. One
    that cannot be removed is said and appended to ``left``: the next clean-up tries again."""
    left = [] if left is None else left
    wanted = {side_file(entry, tree) for entry in keep for tree in SIDE_TREES}
    removed = 0
    for tree in SIDE_TREES:
        for key_dir in real_dirs(store_root / tree, left):
            try:  # NOTE: per directory: one petal cannot list or remove is said, and the rest is cleaned up
                listed = sorted(key_dir.iterdir())
                gone = sum(remove_or_leave(path, f"a side file ({tree}) of a store entry no version uses", left)
                           for path in listed if path not in wanted)
                removed += gone
                if gone == len(listed) and not any(key_dir.iterdir()):  # NOTE: listed again only once emptied
                    key_dir.rmdir()
            except OSError as exc:
                leave(key_dir, f"a directory of side files ({tree})", f"{exc.strerror or exc}", left)
    return removed


def remove_temp_files(store_root: Path, left: list[dict[str, str]]) -> int:
    """Remove the temp files of side-file writes a killed run left (``.<fp>.parquet.tmp-*``); no side file itself.
    Returns how many. One that cannot be removed is said and appended to ``left``."""
    removed = 0
    for tree in SIDE_TREES:
        for key_dir in real_dirs(store_root / tree, left):
            for path in sorted(key_dir.glob(".*.tmp-*")):
                removed += remove_or_leave(path, f"a temp file ({tree}) a stopped run was writing", left)
    return removed
