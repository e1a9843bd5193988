"""``petal rebuild`` holds the writer lock, yet left a killed run's leftovers (half-written entries in
``OUT/store/tmp/``, side files' temp files ``.<fp>.parquet.tmp-*``) on disk, where the README says the next run
removes them; it now removes them too, and deletes no store entry. ``petal rebuild -q`` was 'No such option' though
``petal index -q`` is one: it is taken (a rebuild shows no progress bar). Real processes, Parquet, FAISS and store;
the fake engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import forkrun
from tests.fake_engine import make_fake_model_dir
from tests.test_reliability import Job, write_shards


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def test_a_rebuild_removes_a_killed_runs_leftovers_and_keeps_every_entry(tmp_path, fake_model):
    write_shards(tmp_path / "data", names="ab")
    job = Job(tmp_path, fake_model)
    assert job.run().rc == 0
    write_shards(tmp_path / "data", names="ab", salt=1)
    assert job.run(fault="after_batch:2:kill").rc < 0
    store = job.out / "store"
    assert any((store / "tmp").iterdir())  # the entry it was writing
    key_dir = next((store / "columns").iterdir())
    temp = key_dir / f".{next(key_dir.iterdir()).name}.tmp-4242"  # a side file's write cut by the kill
    temp.write_bytes(b"PAR1 half")
    entries = sorted(store.glob("shards/*/*"))
    rebuilt = forkrun.petal(["rebuild", str(job.out), "-q", "--json-report", str(tmp_path / "r.json")])
    assert rebuilt.rc == 0, rebuilt.stderr
    assert not any((store / "tmp").iterdir()) and not temp.exists()
    assert sorted(store.glob("shards/*/*")) == entries
    assert rebuilt.report["pruned"]["left"] == []
