"""Two S3-compatible servers, each named only by its SOURCE's ``?endpoint_override=host:port&scheme=http``, holding
the same bucket and key: two objects, two shards, each opened again at its own server.

Before, petal stored both as ``s3://bkt/p/a.parquet`` (the endpoint dropped with the query string): an additive run
from the second server said '1 changed' and replaced the first's rows, a run naming both indexed one of them
(the other dropped without a word), ``--full`` naming the second server re-embedded the first's kept object from
the second, and a search read every shard from the default endpoint. Now an endpoint's object is stored as
``s3+http://HOST:PORT/bkt/p/a.parquet`` (``remote.stored_root``); the default endpoint's stays ``s3://bkt/key``.
Real moto_server processes on loopback, the fake engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from petal.pipeline.index.search import IndexReader
from tests.fake_cli import invoke
from tests.fake_engine import embedded_ids, make_fake_model_dir
from tests.s3_server import S3Server, start_s3
from tests.test_s3_sources import put_shard
from tests.test_s3_uri_options import source, uri_only_env

pytest.importorskip("moto")


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> tuple[S3Server, S3Server]:
    logs = tmp_path_factory.mktemp("moto")
    one = start_s3(logs / "one.log")
    two = start_s3(logs / "two.log")
    for server, prefix in ((one, "alpha"), (two, "beta")):
        server.client().create_bucket(Bucket="bkt")
        put_shard(server, "bkt", "p/a.parquet", prefix, 3)
    yield one, two
    one.stop()
    two.stop()


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


ALPHA, BETA = [f"alpha-{i}" for i in range(3)], [f"beta-{i}" for i in range(3)]


def stored(server: S3Server) -> str:
    return f"s3+http://{server.host_port}/bkt/p/a.parquet"


def index(out: Path, model: Path, env_server: S3Server, log: Path, *args: str):
    return invoke(["index", *args, "--out", str(out), "--model", str(model), "-q"], env=uri_only_env(env_server, log))


def shards(out: Path) -> list[tuple[str, int]]:
    return sorted((record.abs_path, record.rows) for record in IndexReader(out).manifest.shards)


def chain_env(server: S3Server) -> dict[str, str | None]:
    """The server's credentials in the standard chain, no endpoint there (AWS_ENDPOINT_URL unset): a search reaches
    a shard only by the endpoint its stored URI holds."""
    return {**server.env(), "AWS_ENDPOINT_URL": None, "AWS_PROFILE": None, "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}


def test_an_additive_run_from_a_second_server_adds_its_object(servers, fake_model, tmp_path):
    one, two = servers
    out = tmp_path / "out"
    first = index(out, fake_model, one, tmp_path / "l1", source(one, "bkt/p/a.parquet"))
    assert first.exit_code == 0, first.output
    second = index(out, fake_model, two, tmp_path / "l2", source(two, "bkt/p/a.parquet"))
    assert second.exit_code == 0, second.output
    assert embedded_ids(tmp_path / "l2") == BETA
    assert shards(out) == sorted([(stored(one), 3), (stored(two), 3)])
    assert sorted(IndexReader(out).ids.column("id").to_pylist()) == ALPHA + BETA
    # NOTE: a search has no SOURCE: each shard is read at the endpoint its stored URI holds
    np.save(tmp_path / "q.npy", IndexReader(out).index.reconstruct(0))
    shown = invoke(["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "9", "--json",
                    "--show-text"], env=chain_env(one))
    assert shown.exit_code == 0, shown.output
    texts = {h["id"]: h.get("text") for h in json.loads(shown.stdout)["hits"]}
    assert all(texts[i] == f"alpha document {i[-1]} edition 0" for i in ALPHA), texts


def test_one_run_naming_both_servers_indexes_both_objects(servers, fake_model, tmp_path):
    one, two = servers
    out, log = tmp_path / "out", tmp_path / "log"
    result = index(out, fake_model, one, log, source(one, "bkt/p/a.parquet"), source(two, "bkt/p/a.parquet"))
    assert result.exit_code == 0, result.output
    assert sorted(embedded_ids(log)) == ALPHA + BETA
    assert shards(out) == sorted([(stored(one), 3), (stored(two), 3)])


def test_full_reads_a_kept_object_at_its_own_server(servers, fake_model, tmp_path):
    """--full naming only the second server: the first's kept object is read at the first server (its endpoint
    from the stored URI, credentials from the chain), never the second's object of that bucket and key."""
    one, two = servers
    out, log = tmp_path / "out", tmp_path / "log"
    assert index(out, fake_model, one, tmp_path / "l1", source(one, "bkt/p/a.parquet")).exit_code == 0
    result = invoke(["index", source(two, "bkt/p/a.parquet"), "--full", "--out", str(out), "--model", str(fake_model),
                     "-q"], env={**uri_only_env(two, log), **chain_env(one)})
    assert result.exit_code == 0, result.output
    assert sorted(embedded_ids(log)) == ALPHA + BETA
    assert shards(out) == sorted([(stored(one), 3), (stored(two), 3)])


def test_the_default_endpoint_keeps_its_stored_uri_and_a_stored_uri_is_a_source(servers, fake_model, tmp_path):
    """An endpoint from the environment (AWS_ENDPOINT_URL) is the standard chain's: stored as s3://bkt/key, as
    before. The stored s3+http:// URI, given as a SOURCE, names its object at its server."""
    one, _ = servers
    out, log = tmp_path / "out", tmp_path / "log"
    result = invoke(["index", "s3://bkt/p/a.parquet", "--out", str(out), "--model", str(fake_model), "-q"],
                    env={**one.env(), "PETAL_TEST_FAKE_ENGINE": str(log)})
    assert result.exit_code == 0, result.output
    assert shards(out) == [("s3://bkt/p/a.parquet", 3)]
    upper = invoke(["index", "S3://bkt/p/a.parquet", "--out", str(out), "--model", str(fake_model), "-q"],
                   env={**one.env(), "PETAL_TEST_FAKE_ENGINE": str(log)})  # NOTE: a scheme is case-insensitive
    assert upper.exit_code == 0 and "nothing-to-do" in upper.output, upper.output
    again = invoke(["index", stored(one), "--out", str(tmp_path / "out2"), "--model", str(fake_model), "-q"],
                   env={**chain_env(one), "PETAL_TEST_FAKE_ENGINE": str(log)})
    assert again.exit_code == 0, again.output
    assert shards(tmp_path / "out2") == [(stored(one), 3)]


def as_an_older_petal_wrote(out: Path) -> None:
    """The live manifest of ``out`` as a petal that stored every endpoint's objects as s3://bucket/key wrote it: its
    records without ``default_endpoint`` (signed again)."""
    from petal.pipeline.layout import OutputDir
    from tests.test_open_integrity import _resigned

    def edit(manifest: dict) -> None:
        for shard in manifest["shards"]:
            shard.pop("default_endpoint", None)

    _resigned(OutputDir(out).version_dir(IndexReader(out).manifest.version), edit)


def test_an_object_an_older_petal_stored_without_its_endpoint_is_78_then_replaced_by_sync(servers, fake_model,
                                                                                          tmp_path):
    """The default endpoint's s3://bkt/key this petal wrote is its own shard beside a SOURCE's endpoint's; one an
    older petal wrote may be that endpoint's object: an additive run naming it there is 78, --sync replaces it."""
    one, two = servers
    out, log = tmp_path / "out", tmp_path / "log"
    default = invoke(["index", "s3://bkt/p/a.parquet", "--out", str(out), "--model", str(fake_model), "-q"],
                     env={**one.env(), "PETAL_TEST_FAKE_ENGINE": str(log)})
    assert default.exit_code == 0, default.output
    beside = index(out, fake_model, two, tmp_path / "l1", source(two, "bkt/p/a.parquet"))
    assert beside.exit_code == 0, beside.output
    assert shards(out) == sorted([("s3://bkt/p/a.parquet", 3), (stored(two), 3)])
    as_an_older_petal_wrote(out)
    refused = index(out, fake_model, one, tmp_path / "l2", source(one, "bkt/p/a.parquet"))
    assert refused.exit_code == 78, refused.output
    assert f"{stored(one)}: the index holds s3://bkt/p/a.parquet, as an older petal recorded objects" in refused.output
    synced = index(out, fake_model, one, tmp_path / "l3", source(one, "bkt/p/a.parquet"),
                   source(two, "bkt/p/a.parquet"), "--sync")
    assert synced.exit_code == 0, synced.output
    assert shards(out) == sorted([(stored(one), 3), (stored(two), 3)])
