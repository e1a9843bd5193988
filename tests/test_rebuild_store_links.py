"""``petal rebuild OUT`` whose ``store/`` (or one of its trees: ``shards``, ``columns``, ``deleted``, a shard key's
directory) is a symbolic link out of OUT is 73 naming the link, as ``petal index`` is, before any work: nothing
published, the target untouched. Before: a linked ``store`` or ``store/columns`` was read from wherever it led and a
new version published from it (exit 0); a linked ``store/shards`` was 65, "the store entry is damaged".

Real ``petal`` processes, real Parquet and FAISS (the index of ``test_rebuild_unreadable_store``: a tombstone and
stored columns).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_rebuild_unreadable_store import built  # noqa: F401  # the module's fixture

TREES = {
    "store": lambda out: out / "store",
    "store/shards": lambda out: out / "store" / "shards",
    "store/columns": lambda out: out / "store" / "columns",
    "store/deleted": lambda out: out / "store" / "deleted",
    "a shard key's directory": lambda out: sorted((out / "store" / "shards").iterdir())[0],
}


def listing(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("tree", list(TREES))
def test_a_store_tree_linked_out_of_out_is_73_naming_it(built, tmp_path, tree):  # noqa: F811
    out = tmp_path / "out"
    shutil.copytree(built, out, symlinks=True)
    linked = TREES[tree](out)
    elsewhere = tmp_path / "elsewhere" / linked.name
    elsewhere.parent.mkdir()
    shutil.move(linked, elsewhere)
    os.symlink(elsewhere, linked)
    current, versions, before = (out / "CURRENT").read_text(), sorted(os.listdir(out / "versions")), \
        listing(elsewhere)
    proc = subprocess.run([sys.executable, "-m", "petal.cli.main", "rebuild", str(out)], capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 73, proc.stderr[-3000:]
    assert str(linked) in proc.stderr, proc.stderr
    assert "symbolic link" in proc.stderr or "symlink" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert (out / "CURRENT").read_text() == current
    assert sorted(os.listdir(out / "versions")) == versions
    assert listing(elsewhere) == before
