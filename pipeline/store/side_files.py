"""Files the store keeps about a committed entry, outside it (an entry is never modified after commit):

```
OUT/store/deleted/<shard key>/<fingerprint>.parquet   tombstones: rows removed by --delete (tombstones.py)
OUT/store/columns/<shard key>/<fingerprint>.parquet   stored text and --keep-columns (columns.py)
```

They live and go with their entry: ``prune_side_files`` removes those of entries no longer kept.
"""

from __future__ import annotations

import shutil
from pathlib import Path

SIDE_TREES = ("deleted", "columns")


def side_file(entry_dir: Path, tree: str) -> Path:
    """``OUT/store/<tree>/<shard key>/<fingerprint>.parquet`` for the entry in ``OUT/store/shards/<key>/<fp>``."""
    store_root = entry_dir.parent.parent.parent
    return store_root / tree / entry_dir.parent.name / f"{entry_dir.name}.parquet"


def prune_side_files(store_root: Path, keep: set[Path]) -> int:
    """Remove side files (and leftovers of interrupted writes) whose entry is not in ``keep``. Returns how many."""
    wanted = {side_file(entry, tree) for entry in keep for tree in SIDE_TREES}
    removed = 0
    for tree in SIDE_TREES:
        root = store_root / tree
        if not root.is_dir():
            continue
        for key_dir in list(root.iterdir()):
            for path in list(key_dir.iterdir()) if key_dir.is_dir() else [key_dir]:
                if path not in wanted:
                    if path.is_dir():
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        path.unlink(missing_ok=True)
                    removed += 1
            if key_dir.is_dir() and not any(key_dir.iterdir()):
                key_dir.rmdir()
    return removed
