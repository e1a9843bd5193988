"""``petal rebuild`` after ``CURRENT`` was set back past a ``--delete`` run (README "rollback"): the tombstones hold for
every later run, so the rebuild leaves those documents out, as ``petal index`` after the same rollback does, and now
says so. Before: the rebuilt manifest copied the rolled-back version's counts (``deleted: 0``, per shard 0) beside
fewer ``vectors``, ``petal info`` said '40 read, 40 embedded, 0 deleted' of a 38-vector index, the summary line said
nothing, and the next plain ``petal index`` published again (its recorded deletions differed from the store's).

Real ``petal index``/``petal rebuild`` processes (tests/forkrun.py) over real Parquet, FAISS and store, with the
fake engine (deterministic vectors, no model weights).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir, read_manifest
from petal.pipeline.manifest import Manifest
from tests import forkrun
from tests.fake_engine import make_fake_model_dir
from tests.invariants import live

EARLIER = "deleted earlier (by the --delete of an earlier run)"


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


class Out:
    """DATA's a.parquet (a0..a9) and b.parquet (b0..b9) indexed into OUT; the runs on it, one report each."""

    def __init__(self, root: Path, model: Path) -> None:
        self.root, self.model = root, model
        self.data, self.out = root / "data", root / "out"
        self.count = 0
        self.data.mkdir()
        for name in ("a", "b"):
            pq.write_table(pa.table({"id": [f"{name}{i}" for i in range(10)],
                                     "text": [f"{name} text {i} with some words" for i in range(10)]}),
                           self.data / f"{name}.parquet")

    def _report(self) -> str:
        self.count += 1
        return str(self.root / f"report-{self.count}.json")

    def index(self, *extra: str | Path, sources: tuple[Path, ...] = ()) -> forkrun.Result:
        argv = ["index", *map(str, sources or (self.data,)), "--out", str(self.out), "--model", str(self.model),
                "--max-seqs", "4", "--keep-versions", "9", "--json-report", self._report(), *map(str, extra)]
        result = forkrun.petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(self.root / f"fake-{self.count}.jsonl")})
        assert result.rc == 0, result.stderr
        return result

    def delete(self, *ids: str, extra: tuple[str, ...] = ()) -> str:
        """A ``--delete`` run of ``ids``; returns the version it published."""
        path = self.root / f"delete-{self.count}.parquet"
        pq.write_table(pa.table({"id": list(ids)}), path)
        result = self.index("--delete", path, *extra)
        assert result.report["rows"]["deleted"] == len(ids), result.report
        return self.current()

    def rebuild(self) -> forkrun.Result:
        result = forkrun.petal(["rebuild", str(self.out), "--keep-versions", "9", "--json-report", self._report()])
        assert result.rc == 0, result.stderr
        return result

    def current(self) -> str:
        version = OutputDir(self.out).current_version()
        assert version is not None
        return version

    def manifest(self) -> Manifest:
        return read_manifest(self.out / "versions" / self.current() / "manifest.json", self.out)

    def roll_back(self, version: str) -> None:
        (self.out / "CURRENT").write_text(f"{version}\n")

    def ids(self) -> set[str]:
        return set(live(self.out)[0])  # complete, one id per vector (tests/invariants.py)


@pytest.fixture
def o(tmp_path, fake_model) -> Out:
    o = Out(tmp_path, fake_model)
    o.index()
    return o


def deleted_by_shard(manifest: Manifest) -> dict[str, int]:
    return {Path(s.path).name: s.deleted for s in manifest.shards}


def check_counts(o: Out, want_ids: set[str], deleted: dict[str, int]) -> None:
    """The live version holds ``want_ids``, and its manifest (what ``petal info`` prints) counts what is absent."""
    manifest = o.manifest()
    assert o.ids() == want_ids
    assert deleted_by_shard(manifest) == deleted
    counts = manifest.counts
    assert (counts.rows, counts.embedded, counts.deleted, counts.vectors) == \
        (20, 20, sum(deleted.values()), len(want_ids)), counts
    assert counts.embedded - counts.deleted == counts.vectors  # no id in two shards here: nothing superseded
    info = forkrun.petal(["info", str(o.out)])
    assert info.rc == 0 and f"20 read, 20 embedded, 0 truncated, {counts.deleted} deleted" in info.stdout, info.stdout


ALL = {f"{name}{i}" for name in "ab" for i in range(10)}


def test_a_rebuild_after_a_rollback_past_a_delete_counts_and_says_what_it_leaves_out(o):
    v1 = o.current()
    o.delete("a6", "b6")
    o.roll_back(v1)
    rebuilt = o.rebuild()
    assert rebuilt.report["index"]["deleted"] == 2 and rebuilt.report["index"]["num_vectors"] == 18
    assert rebuilt.last_line.startswith("petal rebuild: success;") and f"2 {EARLIER}" in rebuilt.last_line, \
        rebuilt.last_line
    assert f"2 {EARLIER}" in rebuilt.report["message"]
    assert o.manifest().rebuilt_from == v1
    check_counts(o, ALL - {"a6", "b6"}, {"a.parquet": 1, "b.parquet": 1})
    # what petal index writes after the same rollback: the same counts
    rebuilt_manifest = o.manifest()
    o.roll_back(v1)
    indexed = o.index()
    assert f"2 {EARLIER}" in indexed.last_line, indexed.last_line
    assert o.manifest().counts == rebuilt_manifest.counts
    assert deleted_by_shard(o.manifest()) == deleted_by_shard(rebuilt_manifest)


def test_the_next_plain_run_after_such_a_rebuild_has_nothing_to_do(o):
    """The rebuilt manifest records the store's deletions: a plain run finds the live version built from exactly
    these entries and deletions (before: it published again, its recorded deletions 0 against the store's 2)."""
    v1 = o.current()
    o.delete("a6", "b6")
    o.roll_back(v1)
    rebuilt = o.rebuild().report["version"]
    plain = o.index()
    assert plain.report["status"] == "nothing-to-do" and o.current() == rebuilt, plain.stderr


def test_a_rollback_across_several_deletes(o):
    v1 = o.current()
    v2 = o.delete("a1")
    o.delete("b2", "b3")
    o.roll_back(v2)  # counts a1; b2 and b3 were deleted after it
    rebuilt = o.rebuild()
    assert f"2 {EARLIER}" in rebuilt.last_line and rebuilt.report["index"]["deleted"] == 3, rebuilt.stderr
    check_counts(o, ALL - {"a1", "b2", "b3"}, {"a.parquet": 1, "b.parquet": 2})
    o.roll_back(v1)  # before both
    rebuilt = o.rebuild()
    assert f"3 {EARLIER}" in rebuilt.last_line and rebuilt.report["index"]["deleted"] == 3, rebuilt.stderr
    check_counts(o, ALL - {"a1", "b2", "b3"}, {"a.parquet": 1, "b.parquet": 2})


def test_a_delete_in_a_shard_a_later_sync_removed(o):
    """v2 deletes a6 and b6, v3 drops b (--sync); back to v1, b's entry is read again from the store with its
    tombstone: b6 stays out."""
    v1 = o.current()
    o.delete("a6", "b6")
    o.index("--sync", "--max-removed", "100%", sources=(o.data / "a.parquet",))
    assert o.ids() == {f"a{i}" for i in range(10)} - {"a6"}
    o.roll_back(v1)
    rebuilt = o.rebuild()
    assert f"2 {EARLIER}" in rebuilt.last_line and rebuilt.report["index"]["deleted"] == 2, rebuilt.stderr
    check_counts(o, ALL - {"a6", "b6"}, {"a.parquet": 1, "b.parquet": 1})


@pytest.mark.parametrize("deleted", [False, True])
def test_a_rebuild_without_a_rollback_is_as_before(o, deleted):
    """No rollback: the rebuilt version holds and counts what the live one did, and the summary says nothing new."""
    if deleted:
        o.delete("a6", "b6")
    before = o.manifest()
    want = o.ids()
    rebuilt = o.rebuild()
    assert EARLIER not in rebuilt.stderr, rebuilt.stderr
    assert rebuilt.report["index"]["deleted"] == before.counts.deleted == (2 if deleted else 0)
    assert o.manifest().counts == before.counts and deleted_by_shard(o.manifest()) == deleted_by_shard(before)
    check_counts(o, want, deleted_by_shard(before))
