"""``petal index --full`` with row-group ranges (``--workers --range-rows``) embeds every row again.

A scaled run stopped midway leaves committed ranges of a large shard (``OUT/store/parts``); the next run reuses
them, as it should. But a ``--full`` run ("re-embed every shard") reused them too: ranges an earlier run embedded
went into the "rebuilt" index, and the report said ``1 embedded, 0 reused`` beside ``ranges.reused``. Now --full
plans every range afresh. Real spawned workers, real SIGTERM, real Parquet and FAISS, the logging fake engine.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests._scale_shared import Petal
from tests.fake_engine import make_fake_model_dir, read_log
from tests.test_incremental import contents
from tests.test_scale_ranges import parts, write_big_shard
from tests.test_scale_workers import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def test_full_embeds_every_range_again_and_reuses_none(fake_model, tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    ids = write_big_shard(data / "big.parquet", rows=80, group_rows=10)  # 8 row groups: 4 ranges of 20 rows
    base = ["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--max-seqs", "4",
            "--workers", "2", "--range-rows", "20"]
    # NOTE: 0.2 s a batch (5 a range), 1 s from each worker's second range on: the signal, sent once a range is
    # committed, must land before all 4 are; at 0.2 s throughout that window was ~1 s of the test being unscheduled
    first = Petal(base, {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "first.jsonl"),
                         "PETAL_FAULT": "after_batch:1+:sleep=0.2,after_batch:6+:sleep=0.8"}, tmp_path / "first.json")
    wait_for(lambda: len(parts(out)) >= 1)
    first.send_signal(signal.SIGTERM)
    rc, stderr, _ = first.wait()
    assert rc == 143, stderr
    committed = parts(out)
    assert 1 <= len(committed) < 4

    log = tmp_path / "full.jsonl"
    rc, stderr, report = Petal([*base, "--full"], {"PETAL_TEST_FAKE_ENGINE": str(log)}, tmp_path / "full.json").wait()
    assert rc == 0, stderr
    assert report["ranges"]["reused"] == [] and report["ranges"]["rows_reused"] == 0
    assert [r["row_groups"] for r in report["ranges"]["embedded"]] == [[0, 2], [2, 4], [4, 6], [6, 8]]
    embedded = [r["row"] for r in read_log(log) if "row" in r]
    # every row once but the null text (row 41 repeats row 3's id in another range: embedded, dropped at assembly)
    assert sorted(embedded) == [r for r in range(80) if r != 20]
    rows, _ = contents(out)
    assert [r["id"] for r in rows] == [i for n, i in enumerate(ids) if n not in (20, 41)]
    assert parts(out) == []  # the stale ranges went with the assembly


def test_a_stopped_full_run_reuses_the_ranges_it_committed(fake_model, tmp_path):
    """The ranges a --full run committed before a stop are its own: its rerun with --full reuses them (and only
    them), as a resumed run does (RELIABILITY 3)."""
    data, out = tmp_path / "data", tmp_path / "out"
    ids = write_big_shard(data / "big.parquet", rows=80, group_rows=10)
    base = ["index", str(data), "--out", str(out), "--model", str(fake_model), "-q", "--max-seqs", "4",
            "--workers", "2", "--range-rows", "20", "--full"]
    first = Petal(base, {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "first.jsonl"),
                         "PETAL_FAULT": "after_batch:1+:sleep=0.2,after_batch:6+:sleep=0.8"}, tmp_path / "first.json")
    wait_for(lambda: len(parts(out)) >= 1)
    first.send_signal(signal.SIGTERM)
    rc, stderr, _ = first.wait()
    assert rc == 143, stderr
    committed = parts(out)
    assert 1 <= len(committed) < 4

    log = tmp_path / "again.jsonl"
    rc, stderr, report = Petal(base, {"PETAL_TEST_FAKE_ENGINE": str(log)}, tmp_path / "again.json").wait()
    assert rc == 0, stderr
    reused = [tuple(r["row_groups"]) for r in report["ranges"]["reused"]]
    assert len(reused) == len(committed) and report["ranges"]["rows_reused"] > 0
    embedded_groups = [tuple(r["row_groups"]) for r in report["ranges"]["embedded"]]
    assert sorted(reused + embedded_groups) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    embedded = {r["row"] for r in read_log(log) if "row" in r}
    assert not embedded & {row for first_group, stop_group in reused for row in range(first_group * 10,
                                                                                      stop_group * 10)}
    rows, _ = contents(out)
    assert [r["id"] for r in rows] == [i for n, i in enumerate(ids) if n not in (20, 41)]
    assert parts(out) == []
