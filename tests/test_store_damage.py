"""A store entry whose files still read but no longer hold what was committed (bit rot, a bad copy, an edit by
hand) is damaged (RELIABILITY.md promises 3, 17): petal index embeds its shard again instead of publishing the
changed vectors or ids, petal rebuild (no sources to embed) is 65 naming it. Real processes, the fake engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from tests import forkrun
from tests.fake_engine import embedded_ids, make_fake_model_dir

ROWS = 6


def write(data: Path, name: str, salt: int = 0) -> None:
    texts = [f"{name} words {i} edition {salt}" for i in range(ROWS)]
    texts[2] = None  # a rejected row: rejects.parquet has a row to change
    pq.write_table(pa.table({"id": [f"{name}-{salt}-{i}" for i in range(ROWS)], "text": texts}),
                   data / f"{name}.parquet")


class Job:
    def __init__(self, root: Path, model: Path) -> None:
        self.root, self.model, self.data, self.out = root, model, root / "data", root / "out"
        self.count = 0

    def run(self, *argv: str) -> tuple[forkrun.Result, Path]:
        self.count += 1
        log = self.root / f"fake-{self.count}.jsonl"
        argv = argv or ("index", str(self.data), "--out", str(self.out), "--model", str(self.model), "-q")
        result = forkrun.petal(list(argv), {"PETAL_TEST_FAKE_ENGINE": str(log)})
        assert "Traceback" not in result.stderr, result.stderr
        return result, log

    def entry_of(self, name: str) -> Path:
        return next(e.parent for e in (self.out / "store" / "shards").glob("*/*/entry.json")
                    if json.loads(e.read_text())["source"]["path"].endswith(f"{name}.parquet"))

    def vectors(self) -> dict[str, bytes]:
        reader = IndexReader(self.out)
        vectors = reader.index.reconstruct_n(0, reader.ntotal)
        return {doc: vectors[i].tobytes() for i, doc in enumerate(reader.ids.column("id").to_pylist())}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("damage") / "home"
    (root / "data").mkdir(parents=True)
    for name in "ab":
        write(root / "data", name)
    job = Job(root, make_fake_model_dir(root.parent / "model"))
    assert job.run()[0].rc == 0
    return root


@pytest.fixture
def job(pristine, tmp_path) -> Job:
    home = pristine  # the store records the shards' absolute paths: DATA stays where the first run read it
    shutil.copytree(home, tmp_path / "copy", symlinks=True)
    job = Job(home, pristine.parent / "model")
    job.count = 1  # fake-1.jsonl is the first run's log

    def restore() -> None:
        shutil.rmtree(home)
        shutil.copytree(tmp_path / "copy", home, symlinks=True)

    yield job
    restore()


def nan_in_a_vector(entry: Path) -> None:
    vectors = np.load(entry / "embeddings.npy", mmap_mode="r+")
    vectors[0, 3] = np.nan
    vectors.flush()


def one_bit_flipped(entry: Path) -> None:
    vectors = np.load(entry / "embeddings.npy", mmap_mode="r+")
    vectors.view(np.uint32)[1, 0] ^= 1 << 20
    vectors.flush()


def an_id_changed(entry: Path) -> None:
    table = pq.read_table(entry / "rows.parquet")
    ids = table.column("id").to_pylist()
    ids[0] = ids[0][:-1] + "9"  # the id of another document, same length
    pq.write_table(table.set_column(1, "id", pa.array(ids)), entry / "rows.parquet")


def a_reject_changed(entry: Path) -> None:
    table = pq.read_table(entry / "rejects.parquet")
    pq.write_table(table.set_column(1, "reason", pa.array(["duplicate_id"] * table.num_rows)),
                   entry / "rejects.parquet")


@pytest.mark.parametrize("damage", [nan_in_a_vector, one_bit_flipped, an_id_changed, a_reject_changed])
def test_an_entry_changed_since_its_commit_is_embedded_again_and_refused_by_rebuild(job, damage):
    before = job.vectors()
    entry = job.entry_of("a")
    damage(entry)
    rebuilt, _ = job.run("rebuild", str(job.out))
    assert rebuilt.rc == 65 and str(entry) in rebuilt.last_line and "sha256" in rebuilt.last_line, rebuilt.stderr
    write(job.data, "b", salt=1)  # a change, so the run builds a new version from the store
    result, log = job.run()
    assert result.rc == 0, result.stderr
    assert f"{entry}" in result.stderr and "damaged" in result.stderr and "embedding the shard again" in result.stderr
    assert sorted(embedded_ids(log)) == sorted([f"a-0-{i}" for i in range(ROWS) if i != 2]
                                               + [f"b-1-{i}" for i in range(ROWS) if i != 2])
    after = job.vectors()
    assert {doc: v for doc, v in after.items() if doc.startswith("a-")} == \
        {doc: v for doc, v in before.items() if doc.startswith("a-")}  # the committed vectors, not the changed ones
    rejects = pq.read_table(job.entry_of("a") / "rejects.parquet").column("reason").to_pylist()
    assert rejects == ["empty_text"] or rejects == ["null_text"]
    again, log = job.run()
    assert again.rc == 0 and embedded_ids(log) == [] and "damaged" not in again.stderr  # the new entry is whole


def test_an_entry_of_an_older_petal_without_checksums_is_still_reused(job):
    meta_file = job.entry_of("a") / "entry.json"
    meta = json.loads(meta_file.read_text())
    del meta["checksums"]
    meta_file.write_text(json.dumps(meta))
    write(job.data, "b", salt=1)
    result, log = job.run()
    assert result.rc == 0 and "damaged" not in result.stderr, result.stderr
    assert {doc[0] for doc in embedded_ids(log)} == {"b"}  # a reused: no re-embedding storm after an upgrade
