"""A version left on disk stays usable from the store: after the documented rollback (``echo vOLD > OUT/CURRENT``),
``petal rebuild`` and an additive ``petal index`` run read the rolled-back version's store entries.

The clean-up after a publish kept only the new version's entries, so a kept version (``--keep-versions``) or a
leased one lost the entries of the shards that changed since: a rebuild or an additive run after the rollback
exited 78 ("has no committed embeddings"). It now deletes only the entries no version on disk uses; those of a
version pruned go with it (README: "deletes store entries no version uses").

Real ``petal index``/``petal rebuild`` processes (tests/forkrun.py) over real Parquet, FAISS and store, with the
fake engine (deterministic vectors, no model weights).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir, VersionLease, read_manifest
from petal.pipeline.store.embeddings import shard_key
from tests import forkrun
from tests.fake_engine import make_fake_model_dir
from tests.invariants import assert_clean, entries_of_versions, live

ROWS = 6


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def write_shard(path: Path, edition: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    name = path.stem
    pq.write_table(pa.table({"id": [f"{name}-{edition}-{i}" for i in range(ROWS)],
                             "text": [f"{name} text {i} edition {edition} with some words" for i in range(ROWS)]}),
                   path)


class Out:
    """One output directory and the runs on it (the fake engine; one report per run)."""

    def __init__(self, root: Path, model: Path) -> None:
        self.root, self.model = root, model
        self.data, self.out = root / "data", root / "out"
        self.count = 0

    def _report(self) -> Path:
        self.count += 1
        return self.root / f"report-{self.count}.json"

    def index(self, *sources: Path, extra: tuple[str, ...] = ()) -> forkrun.Result:
        argv = ["index", *map(str, sources or (self.data,)), "--out", str(self.out), "--model", str(self.model),
                "-q", "--max-seqs", "4", "--json-report", str(self._report()), *extra]
        return forkrun.petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(self.root / f"fake-{self.count}.jsonl")})

    def rebuild(self) -> forkrun.Result:
        return forkrun.petal(["rebuild", str(self.out), "--json-report", str(self._report())])

    def current(self) -> str:
        version = OutputDir(self.out).current_version()
        assert version is not None
        return version

    def documents(self) -> dict[str, np.ndarray]:
        """The live version's documents: id -> vector (checked complete by ``live``)."""
        ids, vectors = live(self.out)
        return {doc: np.asarray(vectors[i]) for i, doc in enumerate(ids)}

    def entry_of(self, shard: str, version: str) -> Path:
        """The store entry ``version`` built ``shard`` (a file name in DATA) from."""
        manifest = read_manifest(self.out / "versions" / version / "manifest.json", self.out)
        record = next(s for s in manifest.shards if Path(s.path).name == shard)
        return self.out / "store" / "shards" / shard_key(record.abs_path) / record.entry

    def roll_back(self, version: str) -> None:
        (self.out / "CURRENT").write_text(f"{version}\n")  # README "rollback"


def same_documents(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for doc, vector in want.items():
        np.testing.assert_array_equal(got[doc], vector)


@pytest.fixture
def two_versions(tmp_path, fake_model) -> tuple[Out, str, str, dict[str, np.ndarray]]:
    """v1 from a and b (edition 1); b edited, v2 (default --keep-versions 2). Returns (out, v1, v2, v1's docs)."""
    o = Out(tmp_path, fake_model)
    write_shard(o.data / "a.parquet", 1)
    write_shard(o.data / "b.parquet", 1)
    first = o.index()
    assert first.rc == 0, first.stderr
    v1, v1_docs = o.current(), o.documents()
    write_shard(o.data / "b.parquet", 2)
    second = o.index()
    assert second.rc == 0 and second.report["status"] == "success", second.stderr
    v2 = o.current()
    assert OutputDir(o.out).versions() == [v1, v2]
    assert_clean(o.out)
    return o, v1, v2, v1_docs


def test_a_nothing_to_do_run_after_a_rollback_keeps_the_newer_version(two_versions):
    """Before: an additive run naming only an unchanged shard after ``echo v1 > CURRENT`` ended 'nothing-to-do ... the
    live version stays' and had deleted v2 (the newest data), at first without a word, then said. A run that publishes
    nothing removes no version newer than the live one now (a publish does: README): v2 and its store entries stay,
    and pointing CURRENT at it again rolls forward."""
    o, v1, v2, _ = two_versions
    o.roll_back(v1)
    result = o.index(o.data / "a.parquet")
    assert result.rc == 0 and result.report["status"] == "nothing-to-do", result.stderr
    assert OutputDir(o.out).versions() == [v1, v2] and result.report["pruned"]["versions"] == [], result.report
    o.roll_back(v2)
    forward = o.index()
    assert forward.rc == 0 and forward.report["status"] == "nothing-to-do", forward.stderr
    assert OutputDir(o.out).versions() == [v1, v2] and o.current() == v2
    o.documents()  # complete, its entries there


@pytest.mark.parametrize("after", ["rebuild", "additive index"])
def test_a_rolled_back_version_is_rebuilt_and_updated_from_the_store(two_versions, after):
    o, v1, v2, v1_docs = two_versions
    b1 = o.entry_of("b.parquet", v1)
    o.roll_back(v1)
    if after == "rebuild":
        result = o.rebuild()
        assert result.rc == 0 and result.report["status"] == "success", result.stderr
        same_documents(o.documents(), v1_docs)  # a and b as v1 had them (b's edition 1), vectors from the store
    else:  # names only a new shard: a and b are kept from the store, as the rolled-back version had them
        write_shard(o.root / "more" / "c.parquet", 1)
        result = o.index(o.root / "more" / "c.parquet")
        assert result.rc == 0 and result.report["status"] == "success", result.stderr
        assert result.report["shards"]["reused"] == 2 and result.report["shards"]["embedded"] == 1
        docs = o.documents()
        assert sorted(docs) == sorted([*v1_docs, *(f"c-1-{i}" for i in range(ROWS))])
        same_documents({d: v for d, v in docs.items() if not d.startswith("c-")}, v1_docs)
    # NOTE: v2, newer than the live v1, went once the run published (never before: a refused run leaves it)
    assert o.current() == result.report["version"] != v1 and OutputDir(o.out).versions() == [v1, o.current()]
    assert v2 in result.report["pruned"]["versions"], result.report["pruned"]  # said: it was a whole version
    if after == "rebuild":  # not -q
        assert f"note: removed {v2} (newer than the live version {v1}" in result.stderr, result.stderr
    assert b1.is_dir()

    # --keep-versions 1: the versions before the live one go, and with them the store entries only they used
    pruned = o.index(extra=("--keep-versions", "1"))  # DATA's b is edition 2 again
    assert pruned.rc == 0 and pruned.report["status"] == "success", pruned.stderr
    assert OutputDir(o.out).versions() == [o.current()] and pruned.report["pruned"]["store_entries"] >= 1
    assert not b1.exists() and o.entry_of("b.parquet", o.current()).is_dir()
    assert_clean(o.out, keep_versions=1)


def test_every_kept_version_keeps_its_entries_and_a_pruned_one_takes_its_own(two_versions):
    o, v1, v2, _ = two_versions
    b1, b2 = o.entry_of("b.parquet", v1), o.entry_of("b.parquet", v2)
    assert b1 != b2 and b1.is_dir() and b2.is_dir()
    write_shard(o.data / "b.parquet", 3)
    third = o.index()  # --keep-versions 2: v1 goes, and b's edition-1 entry, which only v1 used
    assert third.rc == 0 and third.report["pruned"] == {"versions": [v1], "store_entries": 1, "in_use": [], "left": [],
                                                        "ranges": 0, "unused_kept": 0, "unused_pruned": 0}
    assert not b1.exists() and b2.is_dir() and o.entry_of("b.parquet", o.current()).is_dir()
    assert entries_of_versions(o.out) == {(p.parent.name, p.name) for p in (o.out / "store" / "shards").glob("*/*")}
    assert_clean(o.out)


def test_a_leased_version_keeps_its_entries_until_its_reader_lets_go(two_versions):
    o, v1, _, v1_docs = two_versions
    b1 = o.entry_of("b.parquet", v1)
    with VersionLease(o.out / "versions" / v1) as lease:  # a reader (petal serve) still serving v1
        assert lease.held
        write_shard(o.data / "b.parquet", 3)
        run = o.index(extra=("--keep-versions", "1"))
        assert run.rc == 0 and run.report["pruned"]["in_use"] == [v1], run.stderr
        assert OutputDir(o.out).versions() == [v1, o.current()] and b1.is_dir()
        assert_clean(o.out)
        o.roll_back(v1)  # the served version made live again: rebuildable from the store
        rebuilt = o.rebuild()
        assert rebuilt.rc == 0, rebuilt.stderr
        same_documents(o.documents(), v1_docs)
    # the reader gone: the next run prunes v1, and the entries only it used
    write_shard(o.data / "b.parquet", 4)
    after = o.index(extra=("--keep-versions", "1"))
    assert after.rc == 0 and v1 not in after.report["pruned"]["in_use"], after.stderr
    assert OutputDir(o.out).versions() == [o.current()] and not b1.exists()
    assert_clean(o.out, keep_versions=1)


def test_a_version_whose_manifest_cannot_be_read_deletes_no_entry(two_versions):
    o, v1, _, _ = two_versions
    b1 = o.entry_of("b.parquet", v1)
    (o.out / "versions" / v1 / "manifest.json").write_text("{")  # what v1 uses is unknown now
    write_shard(o.data / "b.parquet", 3)
    run = o.index(extra=("--keep-versions", "3"))
    assert run.rc == 0 and run.report["status"] == "success", run.stderr
    assert "kept every store entry" in run.stderr and "manifest.json" in run.stderr, run.stderr
    assert run.report["pruned"]["store_entries"] == 0 and b1.is_dir()
    # once that version is pruned (by a publish: a run that publishes nothing prunes no version), what no version on
    # disk uses goes
    write_shard(o.data / "b.parquet", 4)
    after = o.index(extra=("--keep-versions", "1"))
    assert after.rc == 0 and "kept every store entry" not in after.stderr, after.stderr
    assert not b1.exists()
    assert_clean(o.out, keep_versions=1)
