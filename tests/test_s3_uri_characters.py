"""An object-store SOURCE named as petal shows it: petal lists, stores and prints an object's URI as its key reads
(``s3://corpus/données/a b.parquet``: the manifest, ``petal info``, a hit's ``shard``), and ``pyarrow``'s
``from_uri`` refused such a URI: a space, a non-ASCII letter, ``[`` or ``{`` was 78 'Cannot parse URI', so a
corpus under a non-ASCII prefix could not be indexed at all, nor one shard re-indexed by the URI petal printed.
Those characters are now percent-encoded before parsing (``%`` kept: an encoded URI names the same object)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_cli import invoke
from tests.fake_engine import embedded_ids, make_fake_model_dir

KEYS = {"données/a b.parquet": "a", "données/x[1].parquet": "x", "données/{y}.parquet": "y", "other/z.parquet": "z"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("moto")
    from tests.s3_server import start_s3

    started = start_s3(tmp_path_factory.mktemp("moto") / "moto.log")
    client = started.client()
    client.create_bucket(Bucket="corpus")
    for key, doc_id in KEYS.items():
        buffer = io.BytesIO()
        pq.write_table(pa.table({"id": [doc_id], "text": [f"document {doc_id}"]}), buffer)
        client.put_object(Bucket="corpus", Key=key, Body=buffer.getvalue())
    yield started
    started.stop()


def index(tmp_path: Path, server, *sources: str):
    log = tmp_path / "fake.log"
    log.unlink(missing_ok=True)
    result = invoke(["index", *sources, "--out", str(tmp_path / "out"), "-q", "--model",
                     str(make_fake_model_dir(tmp_path / "model"))],
                    env={**server.env(), "PETAL_TEST_FAKE_ENGINE": str(log)})
    return result, log


@pytest.mark.parametrize("source, ids", [
    ("s3://corpus/données", ["a", "x", "y"]),  # a prefix
    ("s3://corpus/données/*.parquet", ["a", "x", "y"]),  # a glob below it
    ("s3://corpus/données/a b.parquet", ["a"]),  # objects, as petal shows them
    ("s3://corpus/données/x[1].parquet", ["x"]),
    ("s3://corpus/données/{y}.parquet", ["y"]),
    ("s3://corpus/donn%C3%A9es/a%20b.parquet", ["a"]),  # percent-encoded: the same object
])
def test_an_object_uri_as_petal_shows_it_is_read(tmp_path, server, source, ids):
    result, log = index(tmp_path, server, source)
    assert result.exit_code == 0, result.output
    assert sorted(embedded_ids(log)) == ids
    manifest = json.loads(next((tmp_path / "out" / "versions").glob("*/manifest.json")).read_text())
    shown = sorted(s["path"] for s in manifest["shards"])
    assert shown == sorted(f"s3://corpus/{k}" for k, v in KEYS.items() if v in ids)
    again, log = index(tmp_path, server, *shown)  # the URIs petal stored name the same shards: nothing to do
    assert again.exit_code == 0 and embedded_ids(log) == [], again.output
