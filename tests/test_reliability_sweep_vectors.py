"""The crash-point sweep for ``petal index --vectors-column``: every fault point such a run reaches x {kill, raise},
then one rerun, then RELIABILITY.md's invariants (tests/test_reliability_sweep.py's, for a text run).

Scenario: as the text sweep's, of precomputed vectors (real Parquet, real FAISS, no model): an output with two
versions and a store, shard c edited and shard d new since. The faulted run must store c and d, publish v3 and prune
c's stale entry and v1. Whatever point it dies at, the live version stays complete (a query works, ntotal == the id
map's length, ids unique), and one rerun ends equal to a run never interrupted, storing only what was not committed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.reliability.faults import FAULT_POINTS
from tests.test_reliability_sweep import HIT, Scenario, check_crash, check_rerun, reference_run

ROWS = 12
DIM = 8
MODEL_POINTS = {"after_model_load", "engine_step", "after_batch"}  # a run without a model reaches none of these
POINTS = [p for p in FAULT_POINTS if p not in MODEL_POINTS]


def write_shard(path: Path, name: str, salt: int) -> None:
    seed = sum(map(ord, name)) * 100 + salt
    rows = [list(map(float, v)) for v in np.random.default_rng(seed).standard_normal((ROWS, DIM))]
    rows[3], rows[7] = None, [float("nan")] * DIM  # bad rows in every shard: counted, listed, never indexed
    pq.write_table(pa.table({"id": [f"{name}-{salt}-{i}" for i in range(ROWS)],
                             "emb": pa.array(rows, pa.list_(pa.float32()))}), path, row_group_size=4)


class VectorScenario(Scenario):
    def args(self, *extra: str) -> list[str]:  # the text sweep's run, of the vectors of column emb: no model
        self.runs += 1
        return ["index", str(self.data), "--out", str(self.out), "-q", "--vectors-column", "emb",
                "--json-report", str(self.root / f"report-{self.runs}.json"), *extra]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    s = VectorScenario(tmp_path_factory.mktemp("sweep-vectors"))
    result, _ = reference_run(s, write_shard)
    assert result.report["shards"]["embedded"] == 2 and result.report["rows"]["skipped"] == {
        "null_vector": 4, "non_finite_vector": 4}  # one of each in every shard, the reused ones too
    assert len(s.ref_ids) == 4 * (ROWS - 2)
    again, _ = s.petal()  # after a success, a rerun stores nothing
    assert again.report["status"] == "nothing-to-do" and again.report["shards"]["embedded"] == 0
    return s


def test_the_scenario_reaches_every_fault_point_but_the_models(scenario):
    assert set(scenario.reached) == set(POINTS)
    for point, hit in HIT.items():
        if point in POINTS:
            assert scenario.reached[point] >= hit, (point, scenario.reached[point])


@pytest.mark.parametrize("action", ["kill", "raise"])
@pytest.mark.parametrize("point", POINTS)
def test_crash_then_rerun(scenario, point, action):
    s = scenario
    s.restore()
    committed = check_crash(s, s.petal(f"{point}:{HIT.get(point, 1)}:{action}")[0], point, action)
    rerun, _ = s.petal()
    check_rerun(s, rerun, point)
    assert rerun.report["shards"]["embedded"] == 2 - len(committed)  # only the shards the crash left uncommitted
