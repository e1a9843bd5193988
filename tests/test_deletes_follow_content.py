"""A ``--delete`` holds for the shard's content, whatever the vectors are made with: ``--full`` with another
``--max-length``, ``--quantize``, ``--dim`` (text runs, the packaged model) or another ``--vectors-column`` makes new
store entries for the same content, and their rows deleted earlier stay out, in that version and every later one.
It ends when the content changes. Before: the tombstones were tied to the old entry, so such a run brought the
deleted documents back (and pruned the old tombstone with its entry). Real ``petal.index`` runs, real Parquet."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.manifest import Manifest

DOCS = {"id": [1, 2, 3, 4], "text": ["glaciers move slowly", "rivers carve valleys", "tides follow the moon",
                                     "dunes drift in wind"]}
VECTORS = {"v1": [[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [0.8, 0.6]],
           "v2": [[0.0, 1.0], [1.0, 0.0], [0.8, 0.6], [0.6, 0.8]]}


def live(out: Path) -> tuple[list[int], Manifest]:
    version = (out / "CURRENT").read_text().strip()
    ids = pq.read_table(out / "versions" / version / "ids.parquet", columns=["id"]).column("id").to_pylist()
    return sorted(ids), Manifest.read(out / "versions" / version / "manifest.json")


@pytest.fixture(scope="module")
def deleted(tmp_path_factory) -> dict[str, Path]:
    """One text OUT and one vectors OUT, each indexed, then id 2 deleted; tests copy them."""
    root = tmp_path_factory.mktemp("deleted")
    table = pa.table({**DOCS, **{k: pa.array(v, pa.list_(pa.float32())) for k, v in VECTORS.items()}})
    (root / "d").mkdir()
    pq.write_table(table, root / "d" / "a.parquet")
    pq.write_table(pa.table({"id": [2]}), root / "del.parquet")
    outs = {}
    for mode, extra in (("text", {}), ("vectors", {"vectors_column": "v1"})):
        out = root / mode
        petal.index(str(root / "d"), str(out), quiet=True, **extra)
        report = petal.index(str(root / "d"), str(out), quiet=True, delete=str(root / "del.parquet"), **extra)
        assert report.deletes["deleted"] == 1
        outs[mode] = out
    return outs


def copy_of(deleted: dict[str, Path], mode: str, tmp_path: Path) -> Path:
    """A copy of the module's OUT beside a copy of its source (the store names the shard by absolute path, so
    the copy keeps the shard where it was)."""
    out = tmp_path / mode
    shutil.copytree(deleted[mode], out, symlinks=True)
    return out


@pytest.mark.parametrize("settings", [{"max_length": 64}, {"quantize": "int8"}, {"dim": 128}],
                         ids=["max_length", "quantize", "dim"])
def test_full_with_other_settings_keeps_the_deletion(deleted, tmp_path, settings):
    out = copy_of(deleted, "text", tmp_path)
    source = deleted["text"].parent / "d"
    report = petal.index(str(source), str(out), quiet=True, full=True, **settings)
    ids, manifest = live(out)
    assert ids == [1, 3, 4]
    assert manifest.counts.deleted == 1 and [s.deleted for s in manifest.shards] == [1]
    assert report.index["deleted"] == 1
    # the tombstone now belongs to the new entry: an incremental run with the new settings keeps it out too,
    # and so does a --full run back to the first settings
    again = petal.index(str(source), str(out), quiet=True, **settings)
    assert again.status == "nothing-to-do" and live(out)[0] == [1, 3, 4]
    petal.index(str(source), str(out), quiet=True, full=True)
    ids, manifest = live(out)
    assert ids == [1, 3, 4] and manifest.counts.deleted == 1


def test_another_vectors_column_keeps_the_deletion(deleted, tmp_path):
    out = copy_of(deleted, "vectors", tmp_path)
    source = deleted["vectors"].parent / "d"
    petal.index(str(source), str(out), quiet=True, full=True, vectors_column="v2")
    ids, manifest = live(out)
    assert ids == [1, 3, 4] and manifest.counts.deleted == 1
    # a later --delete adds to the carried rows in the same run's entries
    pq.write_table(pa.table({"id": [4]}), tmp_path / "del4.parquet")
    report = petal.index(str(source), str(out), quiet=True, vectors_column="v2", delete=str(tmp_path / "del4.parquet"))
    assert report.deletes["deleted"] == 1
    assert live(out)[0] == [1, 3]


def test_full_with_other_settings_and_delete_in_one_run(deleted, tmp_path):
    out = copy_of(deleted, "text", tmp_path)
    source = deleted["text"].parent / "d"
    pq.write_table(pa.table({"id": [3]}), tmp_path / "del3.parquet")
    report = petal.index(str(source), str(out), quiet=True, full=True, max_length=32,
                         delete=str(tmp_path / "del3.parquet"))
    assert report.deletes == {**report.deletes, "deleted": 1, "rows": 1}
    ids, manifest = live(out)
    assert ids == [1, 4] and manifest.counts.deleted == 2


def test_changed_content_ends_the_deletion(deleted, tmp_path):
    out = copy_of(deleted, "vectors", tmp_path)
    source = tmp_path / "d"
    shutil.copytree(deleted["vectors"].parent / "d", source)
    # the copy is another shard path: index it, delete 2 there, then change its content and rebuild with new settings
    petal.index(str(source), str(out), quiet=True, vectors_column="v1", full=True, sync=True)
    petal.index(str(source), str(out), quiet=True, vectors_column="v1", delete=str(deleted["vectors"].parent /
                                                                                   "del.parquet"))
    assert live(out)[0] == [1, 3, 4]
    table = pq.read_table(source / "a.parquet")
    pq.write_table(table.set_column(1, "text", pa.array(["changed"] * 4)), source / "a.parquet")
    petal.index(str(source), str(out), quiet=True, full=True, vectors_column="v2")
    ids, manifest = live(out)
    assert ids == [1, 2, 3, 4] and manifest.counts.deleted == 0


def test_damaged_live_manifest_still_keeps_the_deletion(deleted, tmp_path):
    """``--full`` over a live version whose manifest cannot be read: the shard's other entries of the same content
    say what was deleted."""
    out = copy_of(deleted, "text", tmp_path)
    version = (out / "CURRENT").read_text().strip()
    (out / "versions" / version / "manifest.json").write_text("{not json")
    petal.index(str(deleted["text"].parent / "d"), str(out), quiet=True, full=True, max_length=48)
    ids, manifest = live(out)
    assert ids == [1, 3, 4] and manifest.counts.deleted == 1


@pytest.mark.parametrize("settings", [{"full": True, "max_length": 48}, {}], ids=["full", "incremental"])
def test_unreadable_tombstone_is_refused_naming_it(deleted, tmp_path, settings):
    out = copy_of(deleted, "text", tmp_path)
    [tombstone] = [p for p in (out / "store" / "deleted").rglob("*.parquet")]
    tombstone.write_bytes(b"not a parquet file")
    before = (out / "CURRENT").read_text()
    with pytest.raises(petal.BadInputError, match="tombstone") as caught:
        petal.index(str(deleted["text"].parent / "d"), str(out), quiet=True, **settings)
    assert tombstone.name in str(caught.value)
    assert (out / "CURRENT").read_text() == before



def test_lost_tombstone_is_said(deleted, tmp_path, capfd):
    """A tombstone the live version counts that is gone: its rows come back (nothing says which they were), with a
    warning naming the file, in an incremental run and a --full one alike."""
    out = copy_of(deleted, "text", tmp_path)
    source = deleted["text"].parent / "d"
    for full in (False, True):
        fresh = tmp_path / f"copy-{full}"
        shutil.copytree(out, fresh, symlinks=True)
        [tombstone] = [p for p in (fresh / "store" / "deleted").rglob("*.parquet")]
        tombstone.unlink()
        capfd.readouterr()
        petal.index(str(source), str(fresh), full=full, **({"max_length": 64} if full else {}))  # not quiet: stderr
        said = capfd.readouterr().err
        assert tombstone.name in said and "indexed again" in said, said
        assert live(fresh)[0] == [1, 2, 3, 4]
