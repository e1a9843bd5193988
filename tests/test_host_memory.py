"""A host ``MemoryError`` where no read path names its file (the index build, a publish step, a record batch) is
the contract's 74, said in one line with what to do, never an internal error (1) with a traceback: an unattended
job's scheduler must tell "the host ran short" from "petal has a bug". The finished work stays, and a rerun
resumes from it."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.layout import OutputDir
from tests import forkrun
from tests import test_reliability as reliability
from tests.fake_engine import fake_engine_factory
from tests.invariants import assert_clean, live, tree_digest
from tests.test_reliability import write_shards

# the fixtures of test_reliability.py: a fake model (module scope) and a job over shards a, b, c
fake_model = reliability.fake_model
job = reliability.job

POINTS = ["read_batch", "after_batch", "before_index_build", "after_index_build", "before_current_swap"]


@pytest.mark.parametrize("point", POINTS)
def test_out_of_host_memory_is_74_and_the_rerun_resumes(job, point):
    assert job.run().rc == 0
    live_version = OutputDir(job.out).current_version()
    before = tree_digest(job.out / "versions" / live_version)
    write_shards(job.data, "c", 1)  # one changed shard: the run embeds it, builds and publishes
    result = job.run(fault=f"{point}:1:nomem")
    assert result.rc == 74, result.stderr
    assert "Traceback" not in result.stderr and "out of host memory" in result.last_line, result.stderr
    assert result.report["status"] == "failed" and result.report["exit_code"] == 74
    assert "out of host memory" in result.report["message"]
    assert OutputDir(job.out).current_version() == live_version
    assert tree_digest(job.out / "versions" / live_version) == before
    live(job.out)
    rerun = job.run()
    assert rerun.rc == 0 and rerun.report["status"] == "success", rerun.stderr
    assert_clean(job.out)


def test_petal_index_in_python_raises_the_io_error_with_its_report(job, monkeypatch):
    monkeypatch.setenv("PETAL_FAULT", "before_index_build:1:nomem")
    with pytest.raises(petal.PetalError) as caught:
        petal.index(job.data, out=job.out, model=job.model, engine_factory=fake_engine_factory(None))
    assert caught.value.exit_code == 74 and "out of host memory" in str(caught.value)
    assert caught.value.report is not None and caught.value.report.exit_code == 74


def test_petal_embed_out_of_memory_reading_its_input_is_74(tmp_path, fake_model):
    source = tmp_path / "texts.parquet"
    pq.write_table(pa.table({"text": ["one text", "another text"]}), source)
    result = forkrun.petal(["embed", "--model", str(fake_model), "--input", str(source), "--output",
                            str(tmp_path / "vecs.npy")],
                           {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "fake.jsonl"),
                            "PETAL_FAULT": "read_batch:1:nomem"})
    assert result.rc == 74 and "Traceback" not in result.stderr and "out of host memory" in result.stderr, result.stderr
    assert not (tmp_path / "vecs.npy").exists()
