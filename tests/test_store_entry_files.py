"""Every file of a store entry, every way it can be damaged (missing, empty, cut short, garbage, a directory in its
place), on each path a run takes through the store (RELIABILITY.md promise 17): a shard the run names and would
reuse is embedded again from its source, said on stderr and counted in the report (``damaged_entries``); the entry
of a shard an additive run keeps without naming it, and ``petal rebuild`` (no source read), are 65 naming the entry
and the file, nothing published. Real processes, real Parquet files, the fake engine."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests._scale_shared import commit_part
from tests.fake_engine import embedded_ids
from tests.store_homes import HomeJob, home_fixtures

ROWS = 5
FILES = ("embeddings.npy", "rows.parquet", "rejects.parquet", "entry.json")


def write(data: Path, name: str, salt: int = 0) -> None:
    pq.write_table(pa.table({"id": [f"{name}-{salt}-{i}" for i in range(ROWS)],
                             "text": [f"{name} words {i} edition {salt}" for i in range(ROWS)]}),
                   data / f"{name}.parquet")


def removed(path: Path) -> None:
    path.unlink()


def emptied(path: Path) -> None:
    path.write_bytes(b"")


def cut_short(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def garbage(path: Path) -> None:
    path.write_bytes(b"not what petal wrote\n" * 4)


def a_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "x").write_text("x")


DAMAGES = [removed, emptied, cut_short, garbage, a_directory]
CASES = [pytest.param(name, damage, id=f"{name}-{damage.__name__}") for name in FILES for damage in DAMAGES]


class Job(HomeJob):
    def command(self, argv: tuple[str, ...]) -> list[str]:
        """``petal index`` over ``argv`` (default DATA) or ``petal rebuild ...``, each writing report-N.json."""
        report = self.root / f"report-{self.count}.json"
        command = list(argv) if argv[:1] == ("rebuild",) else \
            ["index", *(argv or (str(self.data),)), "--out", str(self.out), "--model", str(self.model), "-q"]
        return [*command, "--json-report", str(report)]


pristine, job = home_fixtures("entry-files", write, Job)


@pytest.mark.parametrize(("name", "damage"), CASES)
def test_a_damaged_entry_of_a_named_shard_is_embedded_again_said_and_counted(job, name, damage):
    """entry.json removed was taken for no entry at all: the shard embedded again without a word; a missing file
    was said as 'damaged (No such file or directory)', garbage as 'damaged (Expecting value: ...)', naming no file."""
    entry = job.entry_of("a")
    damage(entry / name)
    write(job.data, "b", salt=1)  # a change: the run builds a new version, a's entry reused
    result, log = job.run()
    assert result.rc == 0, result.stderr
    warning = next(line for line in result.stderr.splitlines() if str(entry) in line)
    assert "is damaged (" in warning and name in warning and "embedding the shard again" in warning, warning
    assert sorted(embedded_ids(log)) == sorted([f"a-0-{i}" for i in range(ROWS)] + [f"b-1-{i}" for i in range(ROWS)])
    assert result.report is not None
    assert [(d["entry"], d["shard"].endswith("a.parquet"), name in d["reason"])
            for d in result.report["damaged_entries"]] == [(str(entry), True, True)]
    assert "1 damaged store entry embedded again" in result.stderr
    again, log = job.run()
    assert again.rc == 0 and embedded_ids(log) == [] and "damaged" not in again.stderr  # the new entry is whole


@pytest.mark.parametrize(("name", "damage"), CASES)
def test_a_damaged_entry_of_a_kept_shard_or_a_rebuild_is_65_naming_the_entry_and_the_file(job, name, damage):
    """entry.json removed was 78 'the store has no embeddings' where every other file was 65."""
    entry = job.entry_of("a")
    damage(entry / name)
    current = (job.out / "CURRENT").read_text()
    write(job.data, "b", salt=1)
    kept, log = job.run(str(job.data / "b.parquet"))  # additive: a is kept, its source not read
    assert kept.rc == 65, kept.stderr
    assert str(entry) in kept.last_line and "damaged (" in kept.last_line and name in kept.last_line
    assert "a.parquet" in kept.last_line and "name it as a SOURCE" in kept.last_line
    assert embedded_ids(log) == [] and (job.out / "CURRENT").read_text() == current
    rebuilt, _ = job.run("rebuild", str(job.out))
    assert rebuilt.rc == 65, rebuilt.stderr
    assert str(entry) in rebuilt.last_line and name in rebuilt.last_line and "damaged (" in rebuilt.last_line
    assert "a.parquet" in rebuilt.last_line and "run petal index on the sources" in rebuilt.last_line  # whose, and how
    assert (job.out / "CURRENT").read_text() == current


@pytest.mark.parametrize(("name", "damage"), [pytest.param(n, d, id=f"{n}-{d.__name__}") for n in FILES
                                              for d in (removed, garbage)])
def test_a_damaged_committed_range_is_embedded_again_said_and_counted(tmp_path, capsys, name, damage):
    """A committed row-group range (``OUT/store/parts``, a resumed ``--workers --range-rows`` run) without its
    entry.json was skipped without a word (its range embedded again, its directory left behind); any damage is now
    said naming the file and counted (the report's ``damaged_entries``), the range planned again."""
    from petal.pipeline.config import ReadConfig
    from petal.pipeline.ingest.parquet import preflight
    from petal.pipeline.store.embeddings import EmbeddingStore
    from petal.pipeline.store.ranges import RowRange, part_dir, plan_ranges

    shard = tmp_path / "big.parquet"
    pq.write_table(pa.table({"id": [f"big-{i}" for i in range(40)], "text": [f"words {i}" for i in range(40)]}),
                   shard, row_group_size=10)
    [info] = preflight([shard], ReadConfig())
    store = EmbeddingStore(tmp_path / "store")
    store.open()
    store.remember_sha256([info], ["0" * 64])
    for first, stop in ((0, 2), (2, 4)):
        commit_part(store, info, first, stop)
    damaged = part_dir(store, info, "fp", RowRange(0, 2, 4, 20, 20))
    damage(damaged / name)
    plan = plan_ranges(store, [info], ["fp"], 20)
    assert [(r.first_group, r.stop_group) for r, _ in plan.reused[0]] == [(0, 2)]
    assert [(r.first_group, r.stop_group) for r in plan.ranges] == [(2, 4)]
    warning = capsys.readouterr().err
    assert str(damaged) in warning and name in warning and "embedding the range again" in warning, warning
    assert [(d["entry"], d["shard"], name in d["reason"]) for d in store.damaged] == [(str(damaged), str(shard), True)]
    assert not damaged.exists()


def test_a_directory_in_place_of_a_stored_columns_file_is_replaced(job):
    """OUT/store/columns/<key>/<entry>.parquet, the stored text of a shard: a directory in its place stopped the run
    with 74 'cannot write .../.<entry>.parquet.tmp-...: Is a directory', nothing published."""
    entry = job.entry_of("a")
    side = job.out / "store" / "columns" / entry.parent.name / f"{entry.name}.parquet"
    side.unlink()
    side.mkdir()
    (side / "x").write_text("x")
    write(job.data, "b", salt=1)
    result, _ = job.run()
    assert result.rc == 0, result.stderr
    assert str(side) in result.stderr and "is a directory" in result.stderr
    assert pq.read_table(side).column("text").to_pylist() == [f"a words {i} edition 0" for i in range(ROWS)]


def test_a_file_in_place_of_an_entry_is_a_damaged_entry_saying_so(job):
    """A file where the entry's directory belongs was said as 'damaged (entry.json is missing)'."""
    entry = job.entry_of("a")
    shutil.rmtree(entry)
    entry.write_text("x")
    rebuilt, _ = job.run("rebuild", str(job.out))
    assert rebuilt.rc == 65 and f"{entry} is damaged (it is not a directory)" in rebuilt.last_line, rebuilt.stderr
    result, log = job.run()
    assert result.rc == 0 and f"{entry} is damaged (it is not a directory)" in result.stderr, result.stderr
    assert sorted(embedded_ids(log)) == sorted(f"a-0-{i}" for i in range(ROWS)) and (entry / "entry.json").is_file()
