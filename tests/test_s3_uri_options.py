"""An S3-compatible server named only in the SOURCE (``?endpoint_override=host:port&scheme=http``, credentials as the
URI's user info), no ``AWS_ENDPOINT_URL`` or key in the environment: every run that opens an object again reaches it
as that SOURCE does.

The manifest stores an object as ``s3://bucket/key`` only (never a query string or user info), and ``--full`` opened
the kept objects (the live version's, not named by the run) again from that URI: at the AWS default endpoint, so
``petal index s3://bkt/q?endpoint_override=... --full`` was 74 'cannot look up s3://bkt/p/a.parquet: storage error
(... Could not resolve host: bkt.s3.us-east-1.amazonaws.com)' after ~6 s of retries. A kept object is now opened,
and listed again, with the user info and query string of a SOURCE in its bucket; one in a bucket no SOURCE names
goes through the standard chain, as before, and its error says so. Real moto_server on loopback, the fake engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest

from petal.pipeline.index.search import IndexReader
from tests.fake_cli import invoke
from tests.fake_engine import embedded_ids, make_fake_model_dir
from tests.s3_server import S3Server, start_s3
from tests.test_s3_sources import put_shard

pytest.importorskip("moto")


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> S3Server:
    server = start_s3(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def uri_only_env(s3: S3Server, log: Path) -> dict[str, str | None]:
    """No endpoint and no credentials in the environment: only the SOURCE's URI reaches the server. The region is
    kept (moto's), so no lookup of the bucket's region leaves the loopback."""
    return {"AWS_ENDPOINT_URL": None, "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_PROFILE": None,
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
            "PETAL_TEST_FAKE_ENGINE": str(log)}


def source(s3: S3Server, bucket_path: str) -> str:
    """``bucket_path`` as a SOURCE with the server's endpoint and the key in its user info (percent-encoded)."""
    info = f"{quote(s3.access_key, safe='')}:{quote(s3.secret_key, safe='')}"
    return f"s3://{info}@{bucket_path}?endpoint_override={s3.host_port}&scheme=http"


def test_full_incremental_sync_and_workers_reach_kept_objects_as_the_source_does(s3, fake_model, tmp_path):
    client = s3.client()
    client.create_bucket(Bucket="opts")
    p_ids = put_shard(s3, "opts", "p/a.parquet", "a", 4) + put_shard(s3, "opts", "p/b.parquet", "b", 4)
    q_ids = put_shard(s3, "opts", "q/c.parquet", "c", 4)
    out, report = tmp_path / "out", tmp_path / "report.json"
    logs = iter(tmp_path / f"log{n}.jsonl" for n in range(20))
    outputs = []

    def index(bucket_path: str, *flags: str):
        log = next(logs)
        result = invoke(["index", source(s3, bucket_path), "--out", str(out), "--model", str(fake_model), "-q",
                         "--json-report", str(report), *flags], env=uri_only_env(s3, log))
        outputs.append(result.output)
        return result, (embedded_ids(log) if log.exists() else [])

    first, _ = index("opts/p")
    assert first.exit_code == 0, first.output
    additive, _ = index("opts/q")  # p's objects are kept
    assert additive.exit_code == 0, additive.output
    # --full embeds the kept objects again: it reached them at the AWS default endpoint (74)
    full, embedded = index("opts/q", "--full")
    assert full.exit_code == 0, full.output
    assert sorted(embedded) == sorted(p_ids + q_ids)
    assert sorted(IndexReader(out).ids.column("id").to_pylist()) == sorted(p_ids + q_ids)
    manifest = json.loads(next((out / "versions").glob("*/manifest.json")).read_text())
    assert sorted(s["path"] for s in manifest["shards"]) == [f"s3+http://{s3.host_port}/opts/{k}" for k in
                                                            ("p/a.parquet", "p/b.parquet", "q/c.parquet")]

    # an incremental run: only the changed object is embedded, the other read by its footer through the URI
    changed = put_shard(s3, "opts", "p/b.parquet", "b", 4, edition=1)
    again, embedded = index("opts/p")
    assert again.exit_code == 0, again.output
    assert sorted(embedded) == sorted(changed)
    assert json.loads(report.read_text())["shard_changes"]["changed"] == [f"s3+http://{s3.host_port}/opts/p/b.parquet"]

    # worker processes read what the coordinator listed (its filesystem, options included)
    put_shard(s3, "opts", "p/a.parquet", "a", 4, edition=2)
    workers, embedded = index("opts/p", "--workers", "2", "--full")
    assert workers.exit_code == 0, workers.output
    assert sorted(embedded) == sorted(p_ids + q_ids)

    # --sync drops what is not named; the kept objects are never opened
    synced, _ = index("opts/q", "--sync", "--max-removed", "100%")
    assert synced.exit_code == 0, synced.output
    assert sorted(IndexReader(out).ids.column("id").to_pylist()) == sorted(q_ids)

    for argv in (["rebuild", str(out)], ["verify", str(out)], ["info", str(out)]):
        result = invoke(argv, env=uri_only_env(s3, tmp_path / "none.jsonl"))
        assert result.exit_code == 0, (argv, result.output)
        outputs.append(result.output)

    # no credential or query string anywhere: store, versions, report, output
    for path in [*out.rglob("*"), report]:
        if path.is_file():
            data = path.read_bytes()
            assert s3.secret_key.encode() not in data and s3.access_key.encode() not in data, path
            assert b"endpoint_override" not in data, path
    for output in outputs:
        assert s3.secret_key not in output and s3.access_key not in output and "endpoint_override" not in output


def test_a_kept_object_in_a_bucket_no_source_names_goes_through_the_standard_chain(s3, fake_model, tmp_path):
    """Only a SOURCE in the kept object's bucket (at its endpoint) says how to reach it; another bucket's options are
    never guessed. Without one, the object is looked up at the endpoint its stored URI holds, with the standard
    chain's credentials, and its error names that."""
    client = s3.client()
    for bucket in ("chain-a", "chain-b"):
        client.create_bucket(Bucket=bucket)
    a_ids = put_shard(s3, "chain-a", "d/a.parquet", "a", 3)
    b_ids = put_shard(s3, "chain-b", "d/b.parquet", "b", 3)
    out = tmp_path / "out"

    def index(*sources: str, env: dict[str, str | None], flags: tuple[str, ...] = ()):
        return invoke(["index", *sources, "--out", str(out), "--model", str(fake_model), "-q", *flags], env=env)

    env = uri_only_env(s3, tmp_path / "log.jsonl")
    assert index(source(s3, "chain-a/d"), env=env).exit_code == 0
    assert index(source(s3, "chain-b/d"), env=env).exit_code == 0  # chain-a's object is kept
    # the standard chain's endpoint (nothing listens there) is not the one the stored URI holds; no key in it
    unreachable = {**env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    lost = index(source(s3, "chain-b/d"), env=unreachable, flags=("--full",))
    assert lost.exit_code == 78, lost.output
    last = lost.output.strip().splitlines()[-1]
    assert f"cannot look up s3+http://{s3.host_port}/chain-a/d/a.parquet (looked up at the endpoint it was indexed " \
           "from, with the credentials of the storage's standard chain, as no SOURCE names its bucket there" in last
    assert "access denied" in last and s3.secret_key not in lost.output and "endpoint_override" not in lost.output
    # the chain reaches it (the server in the environment), or a SOURCE in its bucket does, under another prefix
    chain = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "chain.jsonl")}
    assert index(source(s3, "chain-b/d"), env=chain, flags=("--full",)).exit_code == 0
    e_ids = put_shard(s3, "chain-a", "e/e.parquet", "e", 3)
    named = index(source(s3, "chain-b/d"), source(s3, "chain-a/e"), env=unreachable, flags=("--full",))
    assert named.exit_code == 0, named.output
    assert sorted(IndexReader(out).ids.column("id").to_pylist()) == sorted(a_ids + b_ids + e_ids)
