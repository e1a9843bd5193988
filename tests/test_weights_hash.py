"""The weights' sha256 off the critical path (pipeline/jobs/weights_hash.py): recorded with the files' stat,
taken from the live manifest when the stat matches, verified in the background before anything is committed
or published; a change the stat cannot see is still exit 78 with nothing published."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest

from petal.pipeline.jobs.weights_hash import FileStat, WeightsHash, with_weights_sha256
from petal.pipeline.layout import OutputDir
from petal.pipeline.manifest import MANIFEST_FILE
from tests.fake_engine import make_fake_model_dir, read_log
from tests.test_reliability import Job, write_shards


@pytest.fixture
def job(tmp_path) -> Job:
    write_shards(tmp_path / "data")
    return Job(tmp_path, make_fake_model_dir(tmp_path / "model"))  # its own weights: the tests rewrite them


def weights_file(job: Job) -> Path:
    return job.model / "model.safetensors"


def rewrite_same_size_same_mtime(path: Path) -> None:
    """Other bytes, same size, the old mtime put back (what ``touch -d`` would do)."""
    before = os.stat(path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the last byte of the (float32 zeros) tensor data
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def live_manifest(job: Job) -> dict:
    out = OutputDir(job.out)
    return json.loads((out.version_dir(out.current_version()) / MANIFEST_FILE).read_text())


def test_the_background_hash_is_the_spec_hash(minilm_spec):
    weights = WeightsHash(minilm_spec)
    assert weights.result() == minilm_spec.weights_sha256
    assert weights.stat_to_record() == weights.stat
    assert weights.stat[0].size == os.stat(minilm_spec.weight_files[0]).st_size
    seeded = with_weights_sha256(minilm_spec, "ab" * 32)
    assert seeded.weights_sha256 == "ab" * 32 and seeded.describe()["weights_sha256"] == "ab" * 32


def test_a_fresh_run_records_the_weights_sha256_and_their_stat(job):
    result = job.run()
    assert result.rc == 0, result.stderr
    model = live_manifest(job)["model"]
    assert model["weights_sha256"] == hashlib.sha256(weights_file(job).read_bytes()).hexdigest()
    assert [FileStat.from_dict(f) for f in model["weights_stat"]] == [FileStat.of(weights_file(job), job.model)]
    assert model["weights_stat"][0]["name"] == "model.safetensors"  # no absolute path: the index stays portable
    assert result.report["model"]["weights_sha256"] == model["weights_sha256"]
    assert "weights_sha256_wait" in result.report["timings_s"]

    write_shards(job.data, "d")  # an incremental run on the same files: the recorded sha256 is taken and verified
    again = job.run()
    assert again.rc == 0, again.stderr
    assert live_manifest(job)["model"]["weights_sha256"] == model["weights_sha256"]


def test_weights_changed_with_same_size_and_mtime_are_refused_before_the_model_loads(job):
    assert job.run().rc == 0
    before = OutputDir(job.out).current_version()
    rewrite_same_size_same_mtime(weights_file(job))  # the stat differs in ctime: hashed before the load
    write_shards(job.data, "d")
    result = job.run()
    assert result.rc == 78 and "weights_sha256" in result.stderr and "--full" in result.stderr, result.stderr
    assert read_log(job.log) == []  # no engine was created
    assert OutputDir(job.out).current_version() == before


def test_weights_changed_behind_a_matching_stat_are_caught_before_anything_is_published(job):
    """The stat cannot see every change (a restored ctime, a clock set back): the background hash does."""
    assert job.run().rc == 0
    out = OutputDir(job.out)
    before = out.current_version()
    committed_before = sorted((out.store_dir / "shards").glob("*/*/entry.json"))
    rewrite_same_size_same_mtime(weights_file(job))
    live = out.current_manifest()  # the live manifest now records the rewritten file's stat with the old sha256
    stat = [FileStat.of(weights_file(job), job.model).to_dict()]
    live = dataclasses.replace(live, model=dataclasses.replace(live.model, weights_stat=tuple(stat)))
    live.write(out.version_dir(before) / MANIFEST_FILE)

    write_shards(job.data, "d")
    result = job.run()
    assert result.rc == 78 and "changed" in result.stderr and "nothing was published" in result.stderr, result.stderr
    assert out.current_version() == before
    assert sorted((out.store_dir / "shards").glob("*/*/entry.json")) == committed_before  # nothing committed

    full = job.run("--full")  # the way out the message names
    assert full.rc == 0, full.stderr
    assert live_manifest(job)["model"]["weights_sha256"] == hashlib.sha256(weights_file(job).read_bytes()).hexdigest()
