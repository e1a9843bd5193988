"""A stopped run resumed by a run that names the shard another way: one spelling of ids per shard, never two.

A shard without an id column gives its rows the ids ``<shard path>:<row>``, the path as the run named it. Before, a
``--workers 2 --range-rows`` run stopped partway left the ranges it committed (``OUT/store/parts``), ids spelled as it
named the shard; a rerun naming the shard another way (relative after absolute, another working directory) reused
them, embedded the rest under its own spelling and assembled one entry holding both (``/abs/data/x.parquet:0`` beside
``data/x.parquet:30``) whose ``id_prefix`` recorded only the later: a third run naming it the first way then let both
spellings of one file pass the collision check. A resumed ``--full`` run kept the entries the stopped one committed
under the other spelling too. Now a committed range or a stopped ``--full`` run's entry is resumed only by a run that
spells the shard as it did; any other embeds it again under its own spelling.

Real processes (spawned workers, the tests' fake engine), real Parquet, store and FAISS.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from tests._scale_shared import Coordinator, Petal
from tests.conftest import REPO
from tests.fake_cli import invoke
from tests.fake_engine import make_fake_model_dir, read_log

pytestmark = pytest.mark.slow

FAKE = "PETAL_TEST_FAKE_ENGINE"
ROWS = 60  # 6 row groups of 10: 3 ranges of 20 rows


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def write_big(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    texts = [f"document {i} about subject {i % 7} and a few more words" for i in range(ROWS)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=10)


def parts(out: Path) -> list[Path]:
    return sorted(p.parent for p in (out / "store" / "parts").glob("*/*/*/entry.json"))


def stopped_with_ranges(tmp_path: Path, model: Path, *flags: str) -> Path:
    """A ``--workers 2 --range-rows 20`` run over ``tmp_path/data`` (named absolutely) whose workers each die
    right after their first range commits (exit 75): one or two of its three ranges are left committed."""
    out = tmp_path / "idx"
    argv = ["index", str(tmp_path / "data"), "--out", str(out), "--model", str(model), "-q", "--max-seqs", "4",
            "--workers", "2", "--range-rows", "20", *flags]
    rc, stderr, _ = Petal(argv, {FAKE: str(tmp_path / "first.jsonl"), "PETAL_FAULT": "store_committed:1:kill"},
                          tmp_path / "first.json").wait()
    assert rc == 75, stderr
    committed = parts(out)
    assert 1 <= len(committed) < 3, committed
    assert {json.loads((p / "entry.json").read_text())["source"]["path"] for p in committed} == \
        {str(tmp_path / "data" / "x.parquet")}
    return out


def held(out: Path) -> list[str]:
    return IndexReader(out).ids.column("id").to_pylist()


def entry_prefixes(out: Path) -> list[str | None]:
    return [json.loads(p.read_text())["id_prefix"] for p in (out / "store" / "shards").glob("*/*/entry.json")]


@pytest.mark.parametrize("flags", [[], ["--sync"]], ids=["additive", "sync"])
def test_ranges_a_stopped_run_committed_are_not_resumed_under_another_spelling(tmp_path, monkeypatch, model, flags):
    write_big(tmp_path / "data" / "x.parquet")
    out = stopped_with_ranges(tmp_path, model)
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "second.jsonl"
    result = invoke(["index", "data", "--out", str(out), "--model", str(model), "-q", "--json-report",
                     str(tmp_path / "second.json"), *flags], env={FAKE: str(log)})
    assert result.exit_code == 0, result.output
    ids = held(out)
    # was: the reused ranges' ids '/abs/data/x.parquet:<row>' beside this run's 'data/x.parquet:<row>'
    assert sorted(ids) == sorted(f"data/x.parquet:{i}" for i in range(ROWS)), ids
    assert entry_prefixes(out) == ["data/x.parquet"]
    assert sorted(r["row"] for r in read_log(log) if "row" in r) == list(range(ROWS))  # every row embedded again
    report = json.loads((tmp_path / "second.json").read_text())
    assert report.get("ranges", {}).get("reused", []) == []
    # a third run naming it the first way: the entry holds 'data/...' ids only, so nothing clashes or doubles
    again = invoke(["index", str(tmp_path / "data"), "--out", str(out), "--model", str(model), "-q"],
                   env={FAKE: str(tmp_path / "third.jsonl")})
    assert again.exit_code == 0, again.output
    assert sorted(held(out)) == sorted(f"data/x.parquet:{i}" for i in range(ROWS))


def test_ranges_resumed_under_the_same_spelling_are_reused(tmp_path, model):
    write_big(tmp_path / "data" / "x.parquet")
    out = stopped_with_ranges(tmp_path, model)
    committed = len(parts(out))
    log = tmp_path / "second.jsonl"
    result = invoke(["index", str(tmp_path / "data"), "--out", str(out), "--model", str(model), "-q"],
                    env={FAKE: str(log)})
    assert result.exit_code == 0, result.output
    prefix = str(tmp_path / "data" / "x.parquet")
    assert sorted(held(out)) == sorted(f"{prefix}:{i}" for i in range(ROWS))
    assert len([r for r in read_log(log) if "row" in r]) == ROWS - 20 * committed  # only the missing ranges


def test_ranges_of_a_stopped_full_run_are_not_resumed_under_another_spelling(tmp_path, monkeypatch, model):
    write_big(tmp_path / "data" / "x.parquet")
    base = ["--model", str(model), "-q", "--out", str(tmp_path / "idx")]
    assert invoke(["index", str(tmp_path / "data"), *base], env={FAKE: str(tmp_path / "zero.jsonl")}).exit_code == 0
    out = stopped_with_ranges(tmp_path, model, "--full")
    monkeypatch.chdir(tmp_path)
    result = invoke(["index", "data", "--full", *base], env={FAKE: str(tmp_path / "second.jsonl")})
    assert result.exit_code == 0, result.output
    assert sorted(held(out)) == sorted(f"data/x.parquet:{i}" for i in range(ROWS))
    assert entry_prefixes(out) == ["data/x.parquet"]


def test_entries_of_a_stopped_full_run_are_not_resumed_under_another_spelling(tmp_path, monkeypatch, model):
    """A ``--full`` run (named absolutely) killed as its first shard commits; its rerun naming the directory
    relatively embeds that shard again under that spelling (was: reused, its ids ``/abs/data/a.parquet:<row>``)."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a", "b"):
        pq.write_table(pa.table({"text": [f"{name} document {i}" for i in range(3)]}), data / f"{name}.parquet")
    out = tmp_path / "idx"
    base = ["--model", str(model), "-q", "--out", str(out)]
    assert invoke(["index", str(data), *base], env={FAKE: str(tmp_path / "zero.jsonl")}).exit_code == 0

    def killed_full(source: str, log: str) -> None:
        env = {FAKE: str(tmp_path / log), "PETAL_FAULT": "store_committed:1:kill"}
        rc, stderr = Coordinator(["index", source, "--full", *base], env).wait()
        assert rc == -9, stderr

    killed_full(str(data), "first.jsonl")
    monkeypatch.chdir(REPO)  # where the killed runs start (tests/forkrun.py)
    relative = os.path.relpath(data, REPO)
    result = invoke(["index", relative, "--full", *base], env={FAKE: str(tmp_path / "second.jsonl")})
    assert result.exit_code == 0, result.output
    assert sorted(held(out)) == [f"{relative}/{n}.parquet:{i}" for n in ("a", "b") for i in range(3)]
    assert sorted(entry_prefixes(out)) == [f"{relative}/a.parquet", f"{relative}/b.parquet"]
    # the same spelling resumes it: a --full run killed again, rerun as it was named, embeds only the other shard
    killed_full(relative, "third.jsonl")
    log = tmp_path / "fourth.jsonl"
    result = invoke(["index", relative, "--full", *base], env={FAKE: str(log)})
    assert result.exit_code == 0, result.output
    assert len([r for r in read_log(log) if "row" in r]) == 3
    assert sorted(held(out)) == [f"{relative}/{n}.parquet:{i}" for n in ("a", "b") for i in range(3)]
