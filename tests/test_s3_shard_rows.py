"""A hit's row read back from an ``s3://`` shard: ``/search`` ``include: ["metadata"]`` and ``IndexReader.records``.

Before, the reader took the shard's URI for a local path (``Path("s3://...").is_file()`` is never true): every hit of
an object in a bucket had ``"metadata": null``, as if its shard were gone. Real components: moto_server on loopback
(authentication on), ``petal index`` over it (the packaged model), ``petal serve`` in a child process that
reads the bucket with the standard AWS variables, as the index run did.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_cli import invoke
from tests.s3_server import S3Server, start_s3

pytest.importorskip("moto")
pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> S3Server:
    server = start_s3(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


def _put(s3: S3Server, bucket: str, key: str, table: pa.Table) -> None:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=8)
    s3.client().put_object(Bucket=bucket, Key=key, Body=buffer.getvalue())


def _table(name: str, rows: int, with_ids: bool) -> pa.Table:
    words = ["river", "engine", "garden", "violin", "planet", "market", "winter", "castle", "doctor", "forest"]
    columns = {"doc": [f"{name}{i}" for i in range(rows)]} if with_ids else {}
    columns.update({"title": [f"{name} title {i}" for i in range(rows)],
                    "body": [f"{words[i % 10]} {words[i // 10]} story number {i}" for i in range(rows)]})
    return pa.table(columns)


@pytest.mark.parametrize("with_ids", [True, False], ids=["id-column", "positional-ids"])
def test_metadata_of_an_s3_shard_hit_is_read_from_the_object(s3, tmp_path, monkeypatch, with_ids):
    from tests.test_serve import Server

    bucket = f"rows-{'ids' if with_ids else 'pos'}"
    s3.client().create_bucket(Bucket=bucket)
    table = _table("a", 20, with_ids)
    _put(s3, bucket, "docs/a.parquet", table)
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)  # the index run and the server read the bucket with the standard chain
    out = tmp_path / "out"
    ids = ("--id-column", "doc") if with_ids else ()
    # NOTE: --vectors-column reads local files only: the packaged model embeds the texts (CPU, 20 short rows)
    result = invoke(["index", f"s3://{bucket}/docs", "--out", str(out), "-q", "--text-column", "body",
                     "--index-factory", "Flat", *ids])
    assert result.exit_code == 0, result.output

    from petal.pipeline.index.search import IndexReader

    reader = IndexReader(out)
    vectors = reader.index.reconstruct_n(0, reader.ntotal)
    (hits,) = reader.search(vectors[[7]], 1)
    assert reader.records(hits, ["title"]) == [{"title": "a title 7"}], reader.missing_shards

    server = Server(tmp_path / "server.log", out)
    try:
        def metadata(row: int) -> object:
            answer = server.client.post("/search", json={"vectors": [vectors[row].tolist()], "k": 1,
                                                         "include": ["metadata"]})
            assert answer.status_code == 200, answer.text
            (hit,) = answer.json()["results"][0]["hits"]
            return hit["metadata"]

        expected = {"title": "a title 7", **({"doc": "a7"} if with_ids else {})}
        assert metadata(7) == expected
        assert metadata(3)["title"] == "a title 3"
        s3.client().delete_object(Bucket=bucket, Key="docs/a.parquet")  # a shard really gone: null, as documented
        assert metadata(7) is None
    finally:
        server.stop()
