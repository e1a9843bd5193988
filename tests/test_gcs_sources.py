"""``gs://`` sources: the GCS client's own retries are bounded, and a chain with no credentials at all is a
configuration error (78) naming the source, not a storage error to rerun (74) after 15 minutes.

Real pyarrow GCS filesystems; no GCS server runs here, so the run's first request fails on its credentials (none in
the environment, no metadata server) before any connection to the loopback endpoint it names.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from pyarrow import fs

from petal.pipeline.ingest.remote import GCS_RETRY_SECONDS, bounded
from tests.fake_cli import invoke
from tests.fake_engine import make_fake_model_dir

GCS_ENV = {"GOOGLE_APPLICATION_CREDENTIALS": None, "GCE_METADATA_HOST": "127.0.0.1:1",
           "GCE_METADATA_ROOT": "127.0.0.1:1", "CLOUDSDK_CONFIG": "/nonexistent-gcloud"}


def retry_limit(filesystem: fs.FileSystem) -> timedelta | None:
    _, (options,) = filesystem.__reduce__()
    return options["retry_time_limit"]


def test_a_gcs_filesystem_retries_for_a_bounded_time_unless_the_uri_says_how_long():
    """from_uri gives GCS the client's 15-minute retry policy; bounded() makes it GCS_RETRY_SECONDS, and keeps the
    URI's own ?retry_limit_seconds; the bound survives pickling (a worker process's filesystem)."""
    import pickle

    default, _ = fs.FileSystem.from_uri("gs://bkt/docs?endpoint_override=127.0.0.1:1&scheme=http")
    assert retry_limit(default) is None
    made = bounded(default)
    assert isinstance(made, fs.GcsFileSystem)
    assert retry_limit(made) == timedelta(seconds=GCS_RETRY_SECONDS)
    assert retry_limit(pickle.loads(pickle.dumps(made))) == timedelta(seconds=GCS_RETRY_SECONDS)
    own, _ = fs.FileSystem.from_uri("gs://bkt/docs?retry_limit_seconds=5&endpoint_override=127.0.0.1:1&scheme=http")
    assert retry_limit(bounded(own)) == timedelta(seconds=5)
    _, (options,) = made.__reduce__()
    assert options["endpoint_override"] == "127.0.0.1:1" and options["scheme"] == "http"


def test_no_gcs_credentials_is_78_naming_the_source_in_bounded_time(tmp_path: Path):
    """Before: 'storage error ...; rerun when the storage recovers' (74) after ~16 minutes of the client retrying
    for an OAuth2 token, and a SIGTERM waited as long."""
    source = "gs://bkt/docs/*.parquet"
    model = make_fake_model_dir(tmp_path / "model")
    env = {**GCS_ENV, "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}
    started = time.monotonic()
    result = invoke(["index", f"{source}?endpoint_override=127.0.0.1:1&scheme=http", "--out", str(tmp_path / "out"),
                     "--model", str(model), "-q"], env=env)
    took = time.monotonic() - started
    assert result.exit_code == 78, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"petal: error: cannot list {source}: no credentials"), last
    assert "GOOGLE_APPLICATION_CREDENTIALS" in last and "endpoint_override" not in last, last
    assert took < 4 * GCS_RETRY_SECONDS, took
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("glob", [False, True])
@pytest.mark.parametrize("key", ["missing", "not json"])
def test_a_credentials_file_that_cannot_be_read_is_78_naming_it(tmp_path: Path, key: str, glob: bool):
    """GOOGLE_APPLICATION_CREDENTIALS naming no file was 1 (an internal error: a bare ArrowException, status UNKNOWN,
    with a traceback); naming a file that is not a key (INVALID_ARGUMENT, an ArrowInvalid) was 66 'names no object
    pyarrow's filesystems can read'. The client fails before any request, so no server runs."""
    credentials = tmp_path / "key.json"
    if key == "not json":
        credentials.write_text("not json\n")
    source = "gs://corpus/shards" + ("/*.parquet" if glob else "")
    model = make_fake_model_dir(tmp_path / "model")
    env = {**GCS_ENV, "GOOGLE_APPLICATION_CREDENTIALS": str(credentials),
           "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}
    result = invoke(["index", f"{source}?endpoint_override=127.0.0.1:1&scheme=http", "--out", str(tmp_path / "out"),
                     "--model", str(model), "-q"], env=env)
    assert result.exit_code == 78, result.output
    assert "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"petal: error: cannot list {source}: "), last
    assert f"credentials file {credentials}" in last and "GOOGLE_APPLICATION_CREDENTIALS" in last, last
    assert "error_info" not in last and len(last) < 600, last


def test_a_kept_object_looked_up_with_unreadable_credentials_is_78(tmp_path: Path, monkeypatch):
    """--full looks up each kept object (open_stored): a bare ArrowException there was 1 with a traceback too."""
    from petal.pipeline.jobs.index_run import _kept_shard_there
    from petal.pipeline.reliability.errors import ConfigError

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    with pytest.raises(ConfigError, match=r"credentials file \S*none\.json"):
        _kept_shard_there("gs://corpus/shards/a.parquet", {},
                          ["gs://corpus/other?endpoint_override=127.0.0.1:1&scheme=http&retry_limit_seconds=1"])
