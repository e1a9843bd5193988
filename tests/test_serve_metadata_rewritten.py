"""``/search`` with ``include: ["metadata"]`` after a source shard was rewritten in place (rows reordered, some
removed) and before the next re-index: a hit's metadata is its own document's or ``null``, never the row that now
sits at the hit's recorded position (it answered another document's columns, ``id`` included, as the hit's).

Real components: ``petal index --vectors-column`` over real Parquet (no model: the server is ready in a second),
``petal serve`` in a child process on a loopback port, the shards rewritten with pyarrow."""

from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_serve import Server, cli_run

pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

DIM = 8


def _table(rows: int, string_ids: bool) -> tuple[pa.Table, np.ndarray]:
    data = np.random.default_rng(1).standard_normal((rows, DIM)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    ids = np.arange(rows)
    table = pa.table({"doc": [f"d{i}" for i in ids] if string_ids else ids, "title": [f"title {i}" for i in ids],
                      "body": [f"document {i}" for i in ids],
                      "vec": pa.FixedSizeListArray.from_arrays(pa.array(data.ravel()), DIM)})
    return table, data


def _metadata(server: Server, vector: np.ndarray) -> tuple[object, object]:
    """The id and the ``metadata`` of the one hit of a search by ``vector`` (k 1, ``include: ["metadata"]``)."""
    answer = server.client.post("/search", json={"vectors": [vector.tolist()], "k": 1, "include": ["metadata"]})
    assert answer.status_code == 200, answer.text
    (hit,) = answer.json()["results"][0]["hits"]
    return hit["id"], hit["metadata"]


@pytest.mark.parametrize("string_ids", [False, True], ids=["integer-ids", "string-ids"])
def test_metadata_of_a_rewritten_shard_is_never_another_documents(tmp_path, string_ids):
    data = tmp_path / "data"
    data.mkdir()
    table, vectors = _table(30, string_ids)
    pq.write_table(table, data / "a.parquet")
    out = tmp_path / "out"
    cli_run("index", data, "--out", out, "-q", "--vectors-column", "vec", "--text-column", "body",
            "--index-factory", "Flat", "--id-column", "doc")
    server = Server(tmp_path / "server.log", out)
    try:
        def metadata(row: int) -> tuple[object, object]:
            return _metadata(server, vectors[row])

        hit_id, before = metadata(7)
        assert before == {"doc": hit_id, "title": "title 7"}
        # the shard rewritten in place: its rows reversed and the first five dropped, not re-indexed yet
        pq.write_table(table.take(list(range(29, 4, -1))), data / "a.parquet")
        after_id, after = metadata(7)
        assert after_id == hit_id
        assert after is None, after  # row 7 now holds document 22: the hit's metadata is unknown, not document 22's
        # the shard put back as it was indexed: the metadata is found again
        pq.write_table(table, data / "a.parquet")
        assert metadata(7)[1] == before
    finally:
        server.stop()


@pytest.mark.parametrize("case", ["positional-ids", "id-column-dropped"])
def test_metadata_of_a_shard_without_its_id_column_comes_only_from_the_file_indexed(tmp_path, case):
    """Where the shard holds no id column, a row cannot show whose it is. Ids by place (``<shard>:<row>``: the shard
    had no id column when indexed): metadata only while the file is the one indexed (its size and time, or its
    sha256 once only touched); ids from a column the shard has lost since: ``null``. Both answered another
    document's columns as the hit's before."""
    data = tmp_path / "data"
    data.mkdir()
    table, vectors = _table(30, True)
    indexed = table.drop_columns(["doc"]) if case == "positional-ids" else table
    pq.write_table(indexed, data / "a.parquet")
    out = tmp_path / "out"
    ids = () if case == "positional-ids" else ("--id-column", "doc")  # the default id column, absent: ids by place
    cli_run("index", data, "--out", out, "-q", "--vectors-column", "vec", "--text-column", "body",
            "--index-factory", "Flat", *ids)
    server = Server(tmp_path / "server.log", out)
    try:
        def metadata(row: int) -> tuple[object, object]:
            return _metadata(server, vectors[row])

        hit_id, before = metadata(7)
        assert before is not None and before["title"] == "title 7"
        if case == "positional-ids":
            assert str(hit_id).endswith("a.parquet:7"), hit_id
            pq.write_table(indexed.take(list(range(29, -1, -1))), data / "a.parquet")  # same size, rows reversed
            assert metadata(7) == (hit_id, None)  # row 7 holds document 22 now
            pq.write_table(indexed, data / "a.parquet")  # the same bytes again, a new modification time
            assert metadata(7) == (hit_id, before)
            # rewritten again with its old modification time put back (cp -p, rsync -t, tar): same size, same mtime,
            # only its ctime says it changed (was: trusted on size and mtime, document 22's columns for row 7)
            # (uncompressed, no dictionary: rows 7 and 8 swapped, the file keeps its size byte for byte)
            shard = data / "a.parquet"
            plain = {"compression": "none", "use_dictionary": False}
            pq.write_table(indexed, shard, **plain)
            plain_at = os.stat(shard).st_mtime_ns
            size = os.stat(shard).st_size
            assert metadata(7) == (hit_id, None)  # (another size than the file indexed: unknown)
            server.stop()
            cli_run("index", data, "--out", out, "-q", "--vectors-column", "vec", "--text-column", "body",
                    "--index-factory", "Flat", "--full")
            server = Server(tmp_path / "server2.log", out)
            assert metadata(7) == (hit_id, before)
            time.sleep(2.1)  # past CTIME_SLACK_NS
            order = list(range(30))
            order[7], order[8] = 8, 7
            pq.write_table(indexed.take(order), shard, **plain)
            os.utime(shard, ns=(plain_at, plain_at))
            assert os.stat(shard).st_size == size
            assert metadata(7) == (hit_id, None)  # row 7 holds document 8 now
        else:
            pq.write_table(table.drop_columns(["doc"]), data / "a.parquet")  # the rows in place, their ids gone
            assert metadata(7) == (hit_id, None)
    finally:
        server.stop()


def test_a_shard_with_a_modification_time_in_the_future_is_not_trusted_on_it(tmp_path):
    """The ctime rule looked one way only: a shard whose mtime is set ahead of its ctime (touch -d tomorrow, a clock
    skewed NFS server) was trusted on size and mtime after a rewrite with that mtime put back: another document's
    columns as the hit's. Such a file's sha256 decides, as for an mtime put back into the past."""
    data = tmp_path / "data"
    data.mkdir()
    table, vectors = _table(30, True)
    indexed = table.drop_columns(["doc"])
    shard = data / "a.parquet"
    plain = {"compression": "none", "use_dictionary": False}
    pq.write_table(indexed, shard, **plain)
    future = time.time_ns() + 86_400 * 10**9
    os.utime(shard, ns=(future, future))
    out = tmp_path / "out"
    cli_run("index", data, "--out", out, "-q", "--vectors-column", "vec", "--text-column", "body",
            "--index-factory", "Flat")
    server = Server(tmp_path / "server.log", out)
    try:
        hit_id, before = _metadata(server, vectors[7])
        assert before is not None and before["title"] == "title 7"
        order = list(range(30))
        order[7], order[8] = 8, 7
        pq.write_table(indexed.take(order), shard, **plain)
        os.utime(shard, ns=(future, future))
        assert _metadata(server, vectors[7]) == (hit_id, None)  # row 7 holds document 8 now
        pq.write_table(indexed, shard, **plain)  # the file indexed again, byte for byte: its sha256 says so
        os.utime(shard, ns=(future, future))
        assert _metadata(server, vectors[7]) == (hit_id, before)
    finally:
        server.stop()
