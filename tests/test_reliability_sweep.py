"""The crash-point sweep: every fault point x {kill, raise}, then one rerun, then the invariants.

Scenario: an output with two versions (v1, v2) and a store, inputs changed since (shard c edited,
shard d new). The faulted run must embed c and d, publish v3, and prune c's stale entry and v1.
Whatever point it dies at, the live version stays complete, and one rerun without faults ends
equal to a run that was never interrupted, having re-embedded only shards left uncommitted.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir
from petal.pipeline.reliability.faults import FAULT_POINTS
from tests import forkrun
from tests.fake_engine import embedded_ids, make_fake_model_dir, read_log
from tests.invariants import assert_clean, live, tree_digest

ROWS = 12
# The hit a fault fires on: the 2nd or 3rd where a point is reached per shard or per batch, so some
# work is committed before the crash and some is not.
HIT = {"read_footer": 3, "read_batch": 2, "engine_step": 3, "after_batch": 3, "store_entry_open": 2,
       "store_commit_begin": 2, "store_commit_mid": 2, "store_commit_rename": 2}
AFTER_SWAP = ("after_publish", "store_prune", "version_prune")  # the new version is live already


def write_shard(path: Path, name: str, salt: int) -> None:
    texts = [f"{name} paragraph {i}, edition {salt}: words about topic {i % 5} and more" for i in range(ROWS)]
    texts[3], texts[7] = None, "   "  # bad rows in every shard: counted, listed, never embedded
    pq.write_table(pa.table({"id": [f"{name}-{salt}-{i}" for i in range(ROWS)], "text": texts}), path)


class Scenario:
    def __init__(self, root: Path) -> None:
        self.work = root / "work"  # NOTE: one fixed path: shard keys are absolute paths
        self.template = root / "template"
        self.data = self.work / "data"
        self.out = self.work / "out"
        self.root = root
        self.model = make_fake_model_dir(root / "model")
        self.runs = 0

    def args(self, *extra: str) -> list[str]:
        self.runs += 1
        return ["index", str(self.data), "--out", str(self.out), "-q", "--max-seqs", "4", "--model", str(self.model),
                "--json-report", str(self.root / f"report-{self.runs}.json"), *extra]

    def petal(self, fault: str | None = None, trace: Path | None = None) -> tuple[forkrun.Result, Path]:
        log = self.root / f"fake-{self.runs + 1}.jsonl"
        env = {"PETAL_TEST_FAKE_ENGINE": str(log), "PETAL_FAULT": fault,
               "PETAL_FAULT_TRACE": str(trace) if trace else None}
        return forkrun.petal(self.args(), env), log

    def restore(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.copytree(self.template, self.work)


def reference_run(s: Scenario, write: Callable[[Path, str, int], None]) -> tuple[forkrun.Result, Path]:
    """v1 (shards a, b, c), v2 (c edited), then c edited again and d new: the template every crash starts from; then
    the never-interrupted run over it, traced, its live version the reference. Shared with the --vectors-column
    sweep (tests/test_reliability_sweep_vectors.py)."""
    s.data.mkdir(parents=True)
    for name in "abc":
        write(s.data / f"{name}.parquet", name, 1)
    assert s.petal()[0].rc == 0  # v1
    write(s.data / "c.parquet", "c", 2)
    assert s.petal()[0].rc == 0  # v2
    write(s.data / "c.parquet", "c", 3)
    write(s.data / "d.parquet", "d", 3)
    shutil.copytree(s.work, s.template)
    s.v2 = OutputDir(s.out).current_version()
    s.v2_digest = tree_digest(s.out / "versions" / s.v2)

    trace = s.root / "trace.txt"
    result, log = s.petal(trace=trace)  # the never-interrupted run
    assert result.rc == 0 and result.report["status"] == "success", result.stderr
    s.reached = Counter(trace.read_text().split())
    s.ref_ids, s.ref_vectors = live(s.out)
    s.entries = {sh.path: sh.entry for sh in OutputDir(s.out).current_manifest().shards}
    assert_clean(s.out)
    return result, log


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    s = Scenario(tmp_path_factory.mktemp("sweep"))
    _, log = reference_run(s, write_shard)
    s.ref_embedded = Counter(embedded_ids(log))
    assert set(s.ref_embedded.values()) == {1} and len(s.ref_embedded) == 2 * (ROWS - 2)  # c and d, once each
    again, log = s.petal()  # after a success, a rerun embeds nothing
    assert again.report["status"] == "nothing-to-do" and embedded_ids(log) == [] and read_log(log) == []
    return s


def test_the_scenario_reaches_every_fault_point(scenario):
    assert set(scenario.reached) == set(FAULT_POINTS)
    for point, hit in HIT.items():
        assert scenario.reached[point] >= hit, (point, scenario.reached[point])


def committed_after_crash(s: Scenario) -> set[str]:
    """Which of the shards the faulted run had to embed (c, d) have a committed store entry now."""
    shards = s.out / "store" / "shards"
    return {Path(path).stem for path, fp in s.entries.items()
            if Path(path).stem in "cd" and any((key / fp / "entry.json").is_file() for key in shards.iterdir())}


@pytest.mark.parametrize("action", ["kill", "raise"])
@pytest.mark.parametrize("point", list(FAULT_POINTS))
def test_crash_then_rerun(scenario, point, action):
    s = scenario
    s.restore()
    committed = check_crash(s, s.petal(f"{point}:{HIT.get(point, 1)}:{action}")[0], point, action)
    rerun, log = s.petal()
    check_rerun(s, rerun, point)
    # re-embedded: exactly the documents of the shards the crash left uncommitted, once each
    expected = Counter({doc: n for doc, n in s.ref_embedded.items() if doc[0] not in committed})
    assert Counter(embedded_ids(log)) == expected
    assert rerun.report["shards"]["embedded"] == 2 - len(committed)


def check_crash(s: Any, crashed: forkrun.Result, point: str, action: str) -> set[str]:
    """The faulted run died as armed and the live version is complete; before the swap it is v2, untouched. Which
    shards the run committed before it died (``committed_after_crash``). Shared with the --vectors-column sweep."""
    if action == "kill":
        assert crashed.rc == -9 and crashed.report is None, crashed.stderr
    else:
        assert crashed.rc == 1 and "injected fault" in crashed.stderr, crashed.stderr
        assert crashed.report["status"] == "failed" and crashed.report["exit_code"] == 1
    layout = OutputDir(s.out)
    ids, _ = live(s.out)
    if point in AFTER_SWAP:
        assert layout.current_version() != s.v2 and ids == s.ref_ids
    else:
        assert layout.current_version() == s.v2 and tree_digest(s.out / "versions" / s.v2) == s.v2_digest
    return committed_after_crash(s)


def check_rerun(s: Any, rerun: forkrun.Result, point: str) -> None:
    """One rerun after the crash ends equal to the never-interrupted run, the output clean, v2 the rollback."""
    assert rerun.rc == 0, rerun.stderr
    assert rerun.report["status"] == ("nothing-to-do" if point in AFTER_SWAP else "success")
    ids, vectors = live(s.out)
    assert ids == s.ref_ids
    np.testing.assert_array_equal(vectors, s.ref_vectors)
    assert_clean(s.out)
    layout = OutputDir(s.out)
    assert layout.versions() == [s.v2, layout.current_version()]  # the rollback target is the last live one
