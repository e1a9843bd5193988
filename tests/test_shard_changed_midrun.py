"""A source shard rewritten or replaced while a run reads it (a producer still writing, a job that overwrites its
output in place) is never indexed as if it were the file preflight saw. Before: the readers opened the path again
and read whatever it held then: the version recorded the old file's sha256 and rows over the new file's vectors,
ids or stored text (``--show-text`` answered id 0 with the text of the new file's first row), and a new row count
was an ``AssertionError`` traceback (exit 1). Now every read of a local shard goes through one descriptor checked
against preflight's stat when opened and after each record batch: exit 75 (temporary failure, retry) naming the
shard, nothing of it committed or published, and the rerun indexes the new content."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.parquet import ShardChangedError, inspect_shard, read_rows
from petal.pipeline.jobs.index_run import default_engine


def write(path: Path, first_id: int, rows: int, word: str, group: int = 10) -> Path:
    pq.write_table(pa.table({"id": list(range(first_id, first_id + rows)),
                             "text": [f"{word} document {i}" for i in range(rows)]}), path, row_group_size=group)
    return path


def replace(path: Path, first_id: int, rows: int, word: str) -> None:
    """Atomically: a new file (inode) under the same name, as most writers publish."""
    tmp = write(path.with_name(path.name + ".tmp"), first_id, rows, word)
    os.replace(tmp, path)


@pytest.mark.parametrize("rewrite", ["in place, same rows", "in place, fewer rows", "replaced"])
def test_a_shard_changed_after_preflight_is_refused_before_its_rows_are_read(tmp_path, rewrite):
    path = write(tmp_path / "a.parquet", 0, 100, "old")
    read = ReadConfig(batch_rows=10)
    info = inspect_shard(path, read)
    if rewrite == "replaced":
        replace(path, 1000, 100, "new")
    else:
        write(path, 1000, 100 if "same" in rewrite else 60, "new")
    with pytest.raises(ShardChangedError, match=r"a\.parquet changed while petal was indexing it") as caught:
        list(read_rows(0, info, read))
    assert caught.value.exit_code == 75


@pytest.mark.parametrize("rewrite", ["in place", "replaced"])
def test_a_shard_changed_while_it_is_read_is_refused_at_the_next_batch(tmp_path, rewrite):
    """In place: the same inode truncated and written again. Replaced: the open file is the old one, but the name
    holds another (the old inode's change time moves as it is unlinked): what was read is no longer the shard."""
    path = write(tmp_path / "a.parquet", 0, 100, "old")
    read = ReadConfig(batch_rows=10)
    info = inspect_shard(path, read)
    rows = read_rows(0, info, read)
    first = next(rows)
    assert first.ids[0] == 0 and first.texts[0] == "old document 0"
    if rewrite == "replaced":
        replace(path, 1000, 60, "new")
    else:
        write(path, 1000, 100, "new")
    with pytest.raises(ShardChangedError):
        list(rows)


@pytest.mark.parametrize("gone", ["removed", "renamed"])
def test_a_shard_removed_after_preflight_is_75_not_a_failing_disk(tmp_path, gone):
    """Removed or renamed (a producer's job moving its output) between preflight and its read: still gone after the
    retries, it is 75 as a changed shard (a rerun settles it), not 74 'rerun when the storage recovers'."""
    path = write(tmp_path / "a.parquet", 0, 100, "old")
    read = ReadConfig(batch_rows=10, read_retries=1, retry_delay_s=0.0)
    info = inspect_shard(path, read)
    if gone == "removed":
        path.unlink()
    else:
        path.rename(tmp_path / "b.parquet")
    with pytest.raises(ShardChangedError, match=r"a\.parquet was removed or renamed while petal was indexing it") \
            as caught:
        list(read_rows(0, info, read))
    assert caught.value.exit_code == 75


def test_an_unchanged_shard_reads_whole(tmp_path):
    path = write(tmp_path / "a.parquet", 0, 100, "old")
    read = ReadConfig(batch_rows=10)
    batches = list(read_rows(0, inspect_shard(path, read), read))
    assert len(batches) == 10 and [i for b in batches for i in b.ids] == list(range(100))


def test_a_run_whose_shard_changes_after_it_is_embedded_publishes_nothing_then_the_rerun_indexes_it(tmp_path):
    """The real model; the shard is rewritten when the engine runs its first step, so the stored text (read from the
    shard after it is embedded) would come from the new file under the old file's ids."""
    src = tmp_path / "src"
    src.mkdir()
    shard = write(src / "a.parquet", 0, 30, "glacier")
    out, report_file = tmp_path / "out", tmp_path / "report.json"

    def rewriting_engine(spec, config):
        engine = default_engine(spec, config)
        step = engine.step

        def first_step(batch):
            if not hasattr(first_step, "done"):
                first_step.done = True  # type: ignore[attr-defined]
                write(shard, 1000, 30, "volcano")  # same rows, other ids and texts
            return step(batch)

        engine.step = first_step  # type: ignore[method-assign]
        return engine

    with pytest.raises(petal.TemporaryFailure, match=r"a\.parquet changed while petal was indexing it") as caught:
        petal.index(str(src), str(out), quiet=True, json_report=str(report_file), engine_factory=rewriting_engine)
    assert caught.value.exit_code == 75
    report = json.loads(report_file.read_text())
    assert report["exit_code"] == 75 and report["status"] == "failed"
    assert not (out / "CURRENT").exists()  # nothing published

    rerun = petal.index(str(src), str(out), quiet=True)
    assert rerun.status == "success"
    with petal.open_index(str(out)) as index:
        hits = index.search(["volcano document 3"], k=30)[0]
        texts = index.texts(hits)
        assert sorted(h.id for h in hits) == list(range(1000, 1030))
        assert all(t == f"volcano document {h.id - 1000}" for h, t in zip(hits, texts))
        assert index.info["shards"][0]["sha256"] == __import__("hashlib").sha256(shard.read_bytes()).hexdigest()
