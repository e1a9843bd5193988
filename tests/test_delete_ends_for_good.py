"""A ``--delete`` ends for good when its shard's content changes or the shard leaves the index (README "Deleting
documents"): a shard that later returns to the content it had (an edit reverted, an old copy restored with ``cp -p``)
or comes back after ``--sync`` dropped it is indexed as it is, every document of it. Before: its old store entry was
reused (kept for a rollback, default ``--keep-versions 2``) with its old tombstone, so the deleted ids went missing
again ('2 vectors; 1 deleted earlier'). A tombstone holds while its shard stays at its entry in the live version; a
run that reuses an entry the live version does not hold the shard at plans it no deleted rows, published with the
version (a killed run changes nothing).

Real ``petal index``/``petal rebuild``/``petal info`` processes (tests/forkrun.py) over real Parquet, FAISS and
store, with the fake engine (deterministic vectors, no model weights).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.layout import OutputDir, read_manifest
from petal.pipeline.manifest import Manifest
from tests import forkrun
from tests.fake_engine import make_fake_model_dir
from tests.invariants import assert_clean, live

EARLIER = "deleted earlier"
TEXTS = ["one cat", "two dog", "three fish"]
EDITED = ["one cat", "two dog", "three fish, edited"]


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


class Out:
    """SRC's a.parquet (ids 1..3) and b.parquet (ids 5..7) indexed into OUT (fake engine); one report a run."""

    def __init__(self, root: Path, model: Path, keep_versions: int) -> None:
        self.root, self.model, self.keep_versions = root, model, keep_versions
        self.src, self.out = root / "src", root / "out"
        self.count = 0
        self.src.mkdir()
        self.write("a", TEXTS)
        self.write("b", ["five owl", "six bee", "seven ant"], (5, 6, 7))

    def write(self, name: str, texts: list[str], ids: tuple[int, ...] = (1, 2, 3)) -> None:
        pq.write_table(pa.table({"id": list(ids), "text": texts}), self.src / f"{name}.parquet")

    def index(self, *extra: str | Path, fault: str | None = None, rc: int = 0) -> forkrun.Result:
        self.count += 1
        argv = ["index", str(self.src), "--out", str(self.out), "--model", str(self.model), "--max-seqs", "4",
                "--keep-versions", str(self.keep_versions), "--json-report", str(self.root / f"r-{self.count}.json"),
                *map(str, extra)]
        result = forkrun.petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(self.root / f"fake-{self.count}.jsonl"),
                                      "PETAL_FAULT": fault})
        assert result.rc == rc, result.stderr
        return result

    def delete(self, *ids: int, extra: tuple[str, ...] = ()) -> forkrun.Result:
        path = self.root / f"delete-{self.count}.parquet"
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path)
        return self.index("--delete", path, *extra)

    def sync(self) -> forkrun.Result:
        return self.index("--sync", "--max-removed", "100%")

    def current(self) -> str:
        version = OutputDir(self.out).current_version()
        assert version is not None
        return version

    def manifest(self) -> Manifest:
        return read_manifest(self.out / "versions" / self.current() / "manifest.json", self.out)

    def ids(self) -> set[int]:
        return set(live(self.out)[0])  # complete, one id per vector (tests/invariants.py)


@pytest.fixture(params=[2, 1], ids=["keep-2", "keep-1"])
def o(request, tmp_path, fake_model) -> Out:
    o = Out(tmp_path, fake_model, request.param)
    o.index()
    return o


def check_live(o: Out, ids: set[int], deleted: dict[str, int], result: forkrun.Result | None = None) -> None:
    """The live version holds ``ids``; its manifest (each shard's ``deleted``, ``counts``), ``petal info``, the run's
    report and summary line count what the index leaves out, and a plain rerun changes nothing."""
    assert o.ids() == ids
    manifest = o.manifest()
    assert {Path(s.path).name: s.deleted for s in manifest.shards} == deleted
    assert manifest.counts.deleted == sum(deleted.values()) and manifest.counts.vectors == len(ids), manifest.counts
    info = forkrun.petal(["info", str(o.out)])
    assert info.rc == 0 and f"{sum(deleted.values())} deleted" in info.stdout, info.stdout
    if result is not None:
        assert result.report["index"]["deleted"] == sum(deleted.values()), result.report["index"]
        assert result.report["index"]["num_vectors"] == len(ids)
        if not sum(deleted.values()):
            assert EARLIER not in result.last_line, result.last_line
    rerun = o.index()
    assert rerun.report["status"] == "nothing-to-do" and o.ids() == ids, rerun.stderr
    assert not [p for p in (o.out / "store").rglob("*.staged-*")]
    assert_clean(o.out, o.keep_versions)


def deleted_then_edited(o: Out) -> None:
    """id 1 deleted, then a.parquet edited: the deletion ends, id 1 is back."""
    assert o.delete(1).report["rows"]["deleted"] == 1 and o.ids() == {2, 3, 5, 6, 7}
    o.write("a", EDITED)
    edited = o.index()
    assert o.ids() == {1, 2, 3, 5, 6, 7} and EARLIER not in edited.last_line, edited.last_line


def test_an_edit_reverted_indexes_every_document(o):
    deleted_then_edited(o)
    o.write("a", TEXTS)
    reverted = o.index()
    assert "1 changed" in reverted.last_line, reverted.last_line
    check_live(o, {1, 2, 3, 5, 6, 7}, {"a.parquet": 0, "b.parquet": 0}, reverted)


def test_an_old_copy_restored_with_cp_p_indexes_every_document(o):
    """The restored file has the very stat the first runs recorded (size, mtime): the store's entry for it is reused
    as it is, nothing embedded, and its old deletion stays ended."""
    shutil.copy2(o.src / "a.parquet", o.root / "a-old.parquet")
    deleted_then_edited(o)
    shutil.copy2(o.root / "a-old.parquet", o.src / "a.parquet")
    reverted = o.index()
    assert reverted.report["shards"]["embedded"] == (0 if o.keep_versions > 1 else 1), reverted.report["shards"]
    check_live(o, {1, 2, 3, 5, 6, 7}, {"a.parquet": 0, "b.parquet": 0}, reverted)


@pytest.mark.parametrize("keep", [3, 1])
def test_a_revert_after_two_edits(tmp_path, fake_model, keep):
    """--keep-versions 3 keeps the first entry through both edits (the default prunes it with the deleting version)."""
    o = Out(tmp_path, fake_model, keep)
    o.index()
    deleted_then_edited(o)
    o.write("a", ["one cat, edited twice", "two dog", "three fish"])
    o.index()
    o.write("a", TEXTS)
    reverted = o.index()
    check_live(o, {1, 2, 3, 5, 6, 7}, {"a.parquet": 0, "b.parquet": 0}, reverted)


def test_a_shard_dropped_by_sync_and_added_back_indexes_every_document(o):
    assert o.delete(6).report["rows"]["deleted"] == 1
    (o.src / "b.parquet").rename(o.root / "b.parquet")
    o.sync()
    assert o.ids() == {1, 2, 3}
    (o.root / "b.parquet").rename(o.src / "b.parquet")
    back = o.index()
    assert "1 added" in back.last_line, back.last_line
    check_live(o, {1, 2, 3, 5, 6, 7}, {"a.parquet": 0, "b.parquet": 0}, back)


def test_a_shard_renamed_and_renamed_back(o):
    """Another name is another shard (its own store key): indexed whole; back under its old name, its old store
    entry is reused, and the deletion made under that name stays ended."""
    assert o.delete(6).report["rows"]["deleted"] == 1
    (o.src / "b.parquet").rename(o.src / "c.parquet")
    renamed = o.sync()
    assert "1 added" in renamed.last_line and "1 removed" in renamed.last_line, renamed.last_line
    check_live(o, {1, 2, 3, 5, 6, 7}, {"a.parquet": 0, "c.parquet": 0}, renamed)
    (o.src / "c.parquet").rename(o.src / "b.parquet")
    back = o.sync()
    check_live(o, {1, 2, 3, 5, 6, 7}, {"a.parquet": 0, "b.parquet": 0}, back)


def test_settings_changed_and_back_after_a_revert(tmp_path, fake_model):
    """The revert is indexed with other settings (--full --max-length 64: another entry, no tombstone), then with
    the first ones again (--full): the first entry (kept: --keep-versions 3) is written again beside its old
    tombstone, and the deletion stays ended."""
    o = Out(tmp_path, fake_model, 3)
    o.index()
    deleted_then_edited(o)
    o.write("a", TEXTS)
    o.index("--full", "--max-length", "64")
    assert o.ids() == {1, 2, 3, 5, 6, 7}
    back = o.index("--full", "--max-length", "128")
    assert o.ids() == {1, 2, 3, 5, 6, 7}, back.last_line
    check_live(o, {1, 2, 3, 5, 6, 7}, {"a.parquet": 0, "b.parquet": 0}, back)


def test_a_delete_in_the_run_that_reverts(o):
    """The reverting run deletes id 2 of the reused entry: id 2 alone is gone (id 1's old deletion stays ended), the
    report counts it deleted now, not already deleted."""
    deleted_then_edited(o)
    o.write("a", TEXTS)
    run = o.delete(1, 2)
    assert run.report["deletes"] == {**run.report["deletes"], "deleted": 2, "already_deleted": 0, "rows": 2}
    assert EARLIER not in run.last_line, run.last_line
    check_live(o, {3, 5, 6, 7}, {"a.parquet": 2, "b.parquet": 0}, run)


def test_a_delete_in_the_run_that_adds_the_shard_back(o):
    assert o.delete(6).report["rows"]["deleted"] == 1
    (o.src / "b.parquet").rename(o.root / "b.parquet")
    o.sync()
    (o.root / "b.parquet").rename(o.src / "b.parquet")
    back = o.delete(7)
    assert back.report["deletes"] == {**back.report["deletes"], "deleted": 1, "already_deleted": 0, "rows": 1}
    check_live(o, {1, 2, 3, 5, 6}, {"a.parquet": 0, "b.parquet": 1}, back)


def test_a_delete_and_an_edit_of_the_shard_in_one_run(o):
    assert o.delete(1).report["rows"]["deleted"] == 1
    o.write("a", EDITED)
    run = o.delete(2)
    assert run.report["deletes"] == {**run.report["deletes"], "deleted": 1, "rows": 1}
    check_live(o, {1, 3, 5, 6, 7}, {"a.parquet": 1, "b.parquet": 0}, run)


def test_a_kept_deletion_still_holds(o):
    """What must not change: plain reruns, --full and a rewrite of the same bytes keep the deletion."""
    assert o.delete(1).report["rows"]["deleted"] == 1
    o.write("a", TEXTS)  # the same bytes written again: a new mtime
    assert o.index().report["status"] == "nothing-to-do"
    check_live(o, {2, 3, 5, 6, 7}, {"a.parquet": 1, "b.parquet": 0})
    full = o.index("--full")
    assert f"1 {EARLIER}" in full.last_line, full.last_line
    check_live(o, {2, 3, 5, 6, 7}, {"a.parquet": 1, "b.parquet": 0}, full)


# the points a reverting run passes around its publish (PETAL_FAULT, pipeline/reliability/faults.py)
FAULTS = [("before_index_build:1:kill", -9), ("after_index_build:1:raise", 1), ("tombstones_staged:1:kill", -9),
          ("tombstones_staged:1:raise", 1), ("before_version_rename:1:kill", -9), ("before_current_swap:1:kill", -9),
          ("after_publish:1:kill", -9), ("store_prune:1:kill", -9), ("version_prune:1:kill", -9)]


@pytest.mark.parametrize("fault, rc", FAULTS)
def test_a_reverting_run_killed_around_its_publish(tmp_path, fake_model, fault, rc):
    """Killed or failing at any step: the live version is whole (its manifest counts what it holds), and the next
    run (or ``petal rebuild``) leaves the index with every document. The reverting run keeps 1 version: it prunes
    the edited one and its store entry."""
    o = Out(tmp_path, fake_model, 2)
    o.index()
    deleted_then_edited(o)
    before = o.current()
    o.write("a", TEXTS)
    o.keep_versions = 1
    o.index(fault=fault, rc=rc)
    published = o.current() != before
    assert o.ids() == {1, 2, 3, 5, 6, 7}  # the edited version, or the reverted one: every document either way
    assert o.manifest().counts.deleted == 0
    if published:
        rebuilt = forkrun.petal(["rebuild", str(o.out), "--keep-versions", str(o.keep_versions), "--json-report",
                                 str(tmp_path / "rebuild.json")])
        assert rebuilt.rc == 0 and rebuilt.report["index"]["deleted"] == 0, rebuilt.stderr
        assert o.ids() == {1, 2, 3, 5, 6, 7}
    rerun = o.index()
    check_live(o, {1, 2, 3, 5, 6, 7}, {"a.parquet": 0, "b.parquet": 0}, None if published else rerun)


def test_a_reverting_run_killed_before_its_publish_then_a_rollback(tmp_path, fake_model):
    """The reverting run's staged tombstone (no rows) never went live: after ``CURRENT`` is set back by hand to the
    first version, which holds a.parquet's entry with nothing deleted, the staged file is removed, not committed, and
    the --delete published after that version still holds (README rollback)."""
    o = Out(tmp_path, fake_model, 9)
    o.index()
    first = o.current()
    deleted_then_edited(o)
    o.write("a", TEXTS)
    o.index(fault="before_current_swap:1:kill", rc=-9)
    assert [p for p in (o.out / "store").rglob("*.staged-*")]
    (o.out / "CURRENT").write_text(f"{first}\n")
    rebuilt = forkrun.petal(["rebuild", str(o.out), "--keep-versions", "9", "--json-report",
                             str(tmp_path / "rebuild.json")])
    assert rebuilt.rc == 0 and "staged tombstones removed" in rebuilt.stderr, rebuilt.stderr
    assert o.ids() == {2, 3, 5, 6, 7} and f"1 {EARLIER}" in rebuilt.last_line, rebuilt.last_line
    assert o.manifest().counts.deleted == 1


def test_a_rollback_past_the_run_that_ended_a_deletion(tmp_path, fake_model):
    """``CURRENT`` set back to the --delete run's version after the deletion ended (edit, revert; --keep-versions 9):
    it stays ended. ``petal rebuild`` refuses (65: that version counts a row the store no longer deletes, and a
    rebuild never indexes one again), ``petal index`` indexes every document."""
    o = Out(tmp_path, fake_model, 9)
    o.index()
    deleted = o.delete(1)
    deleting = o.current()
    assert deleted.report["rows"]["deleted"] == 1
    o.write("a", EDITED)
    o.index()
    o.write("a", TEXTS)
    o.index()
    (o.out / "CURRENT").write_text(f"{deleting}\n")
    rebuilt = forkrun.petal(["rebuild", str(o.out), "--keep-versions", "9"])
    assert rebuilt.rc == 65 and "run petal index on the sources" in rebuilt.stderr, rebuilt.stderr
    assert "a run after the live version ended its --delete of 1 rows" in rebuilt.last_line, rebuilt.last_line
    assert "restore it" not in rebuilt.last_line
    assert o.current() == deleting and o.ids() == {2, 3, 5, 6, 7}
    indexed = o.index()
    assert "ended its --delete of 1 rows" in indexed.stderr and "the rows it lost" not in indexed.stderr, \
        indexed.stderr
    check_live(o, {1, 2, 3, 5, 6, 7}, {"a.parquet": 0, "b.parquet": 0}, indexed)


def test_vectors_column_revert_indexes_every_document(tmp_path):
    """The same with ``--vectors-column`` (one planning path: ``plan_deletions``), through the Python API."""
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    pq.write_table(pa.table({"id": [1]}), tmp_path / "del.parquet")

    def write(last: list[float]) -> None:
        vectors = pa.array([[1.0, 0.0], [0.0, 1.0], last], pa.list_(pa.float32()))
        pq.write_table(pa.table({"id": [1, 2, 3], "text": TEXTS, "emb": vectors}), src / "a.parquet")

    def index(**extra: str) -> None:
        petal.index(str(src), str(out), quiet=True, vectors_column="emb", **extra)

    write([0.6, 0.8])
    index()
    index(delete=str(tmp_path / "del.parquet"))
    write([0.8, 0.6])
    index()
    write([0.6, 0.8])
    index()
    assert set(live(out)[0]) == {1, 2, 3}
    assert read_manifest(out / "versions" / OutputDir(out).current_version() / "manifest.json", out).counts.deleted == 0


def test_a_rollback_to_before_a_shard_was_added_keeps_a_later_deletion_of_it(tmp_path, fake_model):
    """``CURRENT`` set back to a version without b.parquet, then a plain run: b's --delete, published after that
    version, still holds (README). Before, the run saw a shard the live version lacks, indexed id 6 again without a
    word and wrote an empty tombstone over the deletion."""
    o = Out(tmp_path, fake_model, 9)
    (o.src / "b.parquet").rename(tmp_path / "b.parquet")
    o.index()
    before = o.current()
    (tmp_path / "b.parquet").rename(o.src / "b.parquet")
    o.index()
    o.delete(6)
    (o.out / "CURRENT").write_text(f"{before}\n")
    rolled = o.index()
    assert "1 deleted earlier" in rolled.last_line, rolled.last_line
    check_live(o, {1, 2, 3, 5, 7}, {"a.parquet": 0, "b.parquet": 1}, rolled)


def test_a_rollback_to_before_a_shard_was_edited_keeps_a_later_deletion_of_it(tmp_path, fake_model):
    """The same for a shard edited after the version set back to: the deletion made against the edited content
    holds while the shard stays at it."""
    o = Out(tmp_path, fake_model, 9)
    o.index()
    before = o.current()
    o.write("a", EDITED)
    o.index()
    o.delete(1)
    (o.out / "CURRENT").write_text(f"{before}\n")
    rolled = o.index()
    assert "1 deleted earlier" in rolled.last_line, rolled.last_line
    check_live(o, {2, 3, 5, 6, 7}, {"a.parquet": 1, "b.parquet": 0}, rolled)
    o.write("a", TEXTS)  # the content changes again: the deletion ends
    changed = o.index()
    check_live(o, {1, 2, 3, 5, 6, 7}, {"a.parquet": 0, "b.parquet": 0}, changed)
