"""A run that publishes nothing (``nothing-to-do``) removes no version, whatever its ``--keep-versions``: pruning
follows a publish (README), and the run says "the live version stays". A run that does prune says which versions it
removed, on stderr (``petal: note: removed N old versions (--keep-versions K): ...``), as the report's
``pruned.versions`` lists them.

Before: a plain ``petal index`` cron run (the default --keep-versions 2) over an index whose runs kept 4 versions
ended 'nothing-to-do; ... the live version stays' and had deleted two rollback versions and their store entries, with
no word on stderr; no run, publishing or not, ever named the versions it pruned there.

Real ``petal`` processes (forked from a preloaded interpreter: tests/forkrun.py; the text run with the tests' fake
engine), real Parquet and FAISS.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import VersionLease
from tests import forkrun
from tests.fake_engine import make_fake_model_dir

DIM = 8


def write_shard(path: Path, kind: str, seed: int) -> None:
    ids = np.arange(20) + 100 * seed
    if kind == "vectors":
        flat = np.random.default_rng(seed).standard_normal((20, DIM)).astype(np.float32).ravel()
        table = pa.table({"id": ids, "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)})
    else:
        table = pa.table({"id": ids, "text": [f"edition {seed} of document {i}" for i in range(20)]})
    pq.write_table(table, path)


class Runs:
    """``petal index`` runs of one kind (``--vectors-column``, or text with the fake engine) into ``out``."""

    def __init__(self, root: Path, kind: str, model: Path) -> None:
        self.root, self.kind, self.model = root, kind, model
        self.out = root / "out"

    def index(self, source: Path, *extra: object) -> forkrun.Result:
        flags = ["--vectors-column", "emb"] if self.kind == "vectors" else ["--model", str(self.model)]
        env: dict[str, str | None] = {} if self.kind == "vectors" else \
            {"PETAL_TEST_FAKE_ENGINE": str(self.root / "fake.jsonl")}
        return forkrun.petal(["index", str(source), "--out", str(self.out), "--index-factory", "Flat",
                              "--json-report", str(self.root / "r.json"), *flags, *map(str, extra)], env, timeout=300)

    def versions(self) -> list[str]:
        return sorted(p.name for p in (self.out / "versions").iterdir() if not p.name.startswith("."))

    def entries(self) -> list[Path]:
        return sorted((self.out / "store" / "shards").glob("*/*"))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(params=["vectors", "text"])
def runs(request, tmp_path, model) -> Runs:
    """4 versions of data/a.parquet's editions, kept with --keep-versions 10."""
    runs = Runs(tmp_path, request.param, model)
    (tmp_path / "data").mkdir()
    for seed in range(4):
        write_shard(tmp_path / "data" / "a.parquet", request.param, seed)
        done = runs.index(tmp_path / "data" / "a.parquet", "-q", "--keep-versions", 10)
        assert done.rc == 0, done.stderr[-3000:]
    assert len(runs.versions()) == 4 and len(runs.entries()) == 4
    return runs


def test_a_nothing_to_do_run_removes_no_version(runs):
    before, entries = runs.versions(), runs.entries()
    done = runs.index(runs.root / "data" / "a.parquet")  # the default --keep-versions 2
    assert done.rc == 0 and done.report is not None and done.report["status"] == "nothing-to-do", done.stderr
    assert runs.versions() == before and runs.entries() == entries  # was: v1, v2 and their entries gone
    assert done.report["pruned"]["versions"] == [] and "note: removed" not in done.stderr, done.stderr
    done = runs.index(runs.root / "data" / "a.parquet", "--keep-versions", 1)  # even when asked for fewer
    assert done.rc == 0 and runs.versions() == before, done.stderr


def test_a_publish_prunes_and_names_what_it_removed(runs):
    v1, v2, v3, v4 = runs.versions()
    write_shard(runs.root / "b.parquet", runs.kind, 9)
    done = runs.index(runs.root / "b.parquet", "-q")  # additive: a kept, b added; the default --keep-versions 2
    assert done.rc == 0 and done.report is not None and done.report["status"] == "success", done.stderr
    assert runs.versions() == [v4, done.report["version"]]
    assert done.report["pruned"]["versions"] == [v1, v2, v3]
    assert f"petal: note: removed 3 old versions (--keep-versions 2): {v1}, {v2}, {v3}\n" in done.stderr, done.stderr


def test_rebuild_names_the_versions_it_removed(runs):
    v1, v2, v3, v4 = runs.versions()
    done = forkrun.petal(["rebuild", str(runs.out), "--keep-versions", "4", "--json-report", str(runs.root / "r.json")])
    assert done.rc == 0 and done.report is not None, done.stderr
    assert done.report["pruned"]["versions"] == [v1] and runs.versions() == [v2, v3, v4, done.report["version"]]
    assert f"petal: note: removed 1 old version (--keep-versions 4): {v1}\n" in done.stderr, done.stderr
    shutil.rmtree(runs.out / "versions" / v2)  # gone by hand: nothing to remove, nothing said
    done = forkrun.petal(["rebuild", str(runs.out), "--keep-versions", "4"])
    assert done.rc == 0 and "note: removed" not in done.stderr, done.stderr


def test_a_nothing_to_do_run_finishes_the_pruning_a_publish_owes_by_that_publishs_keep_versions(runs):
    """A reader's lease (as a crash or a stop signal) cuts a publish's pruning short: the next run, one that publishes
    nothing included, finishes it with the --keep-versions of that publish, never its own."""
    v1, v2, v3, v4 = runs.versions()
    write_shard(runs.root / "b.parquet", runs.kind, 9)
    with VersionLease(runs.out / "versions" / v1) as lease:
        assert lease.held
        done = runs.index(runs.root / "b.parquet", "-q", "--keep-versions", 2)
        assert done.rc == 0 and done.report is not None, done.stderr
        v5 = done.report["version"]
        assert done.report["pruned"]["in_use"] == [v1] and done.report["pruned"]["versions"] == [v2, v3]
        assert runs.versions() == [v1, v4, v5] and (runs.out / ".pruning").is_file()
    done = runs.index(runs.root / "b.parquet", "--keep-versions", 10)  # nothing-to-do
    assert done.rc == 0 and done.report is not None and done.report["status"] == "nothing-to-do", done.stderr
    assert done.report["pruned"]["versions"] == [v1] and runs.versions() == [v4, v5]
    assert (f"note: removed 1 old version (--keep-versions 2 of the run that published {v5}, whose pruning was cut "
            f"short): {v1}") in done.stderr, done.stderr
    assert not (runs.out / ".pruning").exists()
    done = runs.index(runs.root / "b.parquet", "--keep-versions", 1)  # nothing owed: nothing pruned
    assert done.rc == 0 and runs.versions() == [v4, v5] and "note: removed" not in done.stderr, done.stderr
