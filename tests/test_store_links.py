"""A symbolic link or a file planted where the store keeps a directory per shard key (``OUT/store/shards/<key>``,
``parts/<key>``, ``deleted/<key>``, ``columns/<key>``): petal never follows it out of OUT (RELIABILITY.md promises
14, 16, 17). Before, the clean-up after a publish walked through a link in ``store/shards``, ``parts`` or
``deleted`` and deleted what the directory it named held, wherever that was; a link at a shard's own key was written
through; a file there was a warning every run, or 74 'File exists'. Now a run refuses before the lock (73 naming it,
nothing written or deleted) and every walk of the store that deletes skips what is not a real directory. Real
processes, the fake engine."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir
from petal.pipeline.store.embeddings import EmbeddingStore, shard_key
from petal.pipeline.store.retention import prune_unused
from petal.pipeline.store.side_files import prune_side_files
from tests import forkrun
from tests.fake_engine import make_fake_model_dir
from tests.invariants import assert_clean, tree_digest


def write(data: Path, name: str) -> None:
    pq.write_table(pa.table({"id": [f"{name}-{i}" for i in range(4)], "text": [f"{name} words {i}" for i in range(4)]}),
                   data / f"{name}.parquet")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """DATA (shard a indexed, shard b new since) and the model; ``pristine/out`` after indexing a."""
    root = tmp_path_factory.mktemp("links")
    (root / "data").mkdir()
    write(root / "data", "a")
    make_fake_model_dir(root / "model")
    assert petal(root, root / "out").rc == 0
    write(root / "data", "b")  # the next run embeds b, publishes and cleans up
    return root


def petal(root: Path, out: Path) -> forkrun.Result:
    argv = ["index", str(root / "data"), "--out", str(out), "--model", str(root / "model"), "-q"]
    result = forkrun.petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(root / "log")})
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture
def out(pristine, tmp_path) -> Path:
    """A copy of ``pristine/out`` (the store's keys are the sources' paths, not OUT's: any OUT reads DATA)."""
    shutil.copytree(pristine / "out", tmp_path / "out", symlinks=True)
    return tmp_path / "out"


def victim(tmp_path: Path) -> Path:
    """A directory outside OUT shaped like the store's (an entry, a side file, a staged tombstone)."""
    outside = tmp_path / "outside"
    (outside / "0123456789abcdef01234567").mkdir(parents=True)
    (outside / "0123456789abcdef01234567" / "entry.json").write_text("{}")
    (outside / "precious.parquet").write_text("keep me")
    (outside / "x.staged-1.parquet").write_text("keep me too")
    return outside


@pytest.mark.parametrize("tree", ["shards", "parts", "deleted", "columns"])
@pytest.mark.parametrize("kind", ["link", "file"])
def test_a_link_or_file_in_place_of_a_key_directory_is_73_and_nothing_outside_is_touched(pristine, out, tmp_path,
                                                                                          tree, kind):
    live = OutputDir(out).current_version()
    outside = victim(tmp_path)
    before = tree_digest(outside)
    planted = out / "store" / tree / "0000000000aaaaaaaaaa"
    planted.parent.mkdir(exist_ok=True)
    if kind == "link":
        planted.symlink_to(outside, target_is_directory=True)
    else:
        planted.write_text("not a directory")
    result = petal(pristine, out)
    assert tree_digest(outside) == before
    assert result.rc == 73, result.stderr
    assert str(planted) in result.last_line and "remove it" in result.last_line, result.last_line
    assert OutputDir(out).current_version() == live
    planted.unlink()
    again = petal(pristine, out)
    assert again.rc == 0, again.stderr
    assert_clean(out)


def test_the_clean_up_never_walks_through_a_link(out, tmp_path):
    """A link planted after the run's checks (by hand, while it runs): the store's own walks that delete skip it."""
    outside = victim(tmp_path)
    before = tree_digest(outside)
    store = EmbeddingStore(out / "store")
    links = []
    for tree in ("shards", "parts", "deleted", "columns"):
        link = out / "store" / tree / shard_key("/elsewhere/z.parquet")
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(outside, target_is_directory=True)
        links.append(link)
    prune_unused(OutputDir(out), store, live=set(), was_used=set(), keep_unused_s=0)
    prune_side_files(store.root, keep=set())
    from petal.pipeline.store.tombstones import settle_staged

    settle_staged(OutputDir(out))
    assert tree_digest(outside) == before
