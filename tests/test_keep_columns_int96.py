"""INT96 timestamps (what Spark, Hive and Impala write) kept, shown and matched as the dates they hold.

Before: pyarrow read INT96 as nanoseconds and wrapped what they cannot hold: ``--keep-columns ts`` of 9999-12-31
exited 0 and ``petal query --json`` showed "1816-03-29 05:56:08.066277376", 0001-01-01 "1754-08-30 ...", in the API's
``Hit.fields`` and a shard's metadata (``petal serve``) alike; ``--where`` matched the wrapped value. Real Parquet
written with ``use_deprecated_int96_timestamps=True``, the fake engine and a ``--vectors-column`` run, the CLI and
the API."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.ingest.int96 import arrow_schema, open_parquet
from tests.fake_cli import FAKE_ENGINE_ENV, invoke
from tests.fake_engine import make_fake_model_dir

DATES = [datetime.datetime(9999, 12, 31), datetime.datetime(1, 1, 1), datetime.datetime(2020, 5, 5)]
SHOWN = ["9999-12-31 00:00:00", "0001-01-01 00:00:00", "2020-05-05 00:00:00"]


def write_int96(path: Path, **extra: pa.Array) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    vectors = np.eye(3, 8, dtype=np.float32)
    pq.write_table(pa.table({
        "id": [1, 2, 3], "text": ["glaciers move", "cat sat", "rivers flow"],
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 8),
        "ts": pa.array(DATES, pa.timestamp("us")),
        "tl": pa.array([[d] for d in DATES], pa.list_(pa.timestamp("us"))),
        **extra}), path, use_deprecated_int96_timestamps=True)


def by_id(stdout: str) -> dict[int, dict]:
    return {h["id"]: h["fields"] for line in stdout.splitlines() for h in json.loads(line)["hits"]}


def test_the_schema_checked_is_the_schema_read(tmp_path):
    write_int96(tmp_path / "a.parquet")
    meta = pq.read_metadata(tmp_path / "a.parquet")
    assert str(meta.schema.to_arrow_schema().field("ts").type) == "timestamp[ns]"  # pyarrow's default, wrapping
    with open_parquet(tmp_path / "a.parquet") as pf:
        assert arrow_schema(meta) == pf.schema_arrow
        assert pf.read(columns=["ts"]).column("ts").to_pylist() == DATES


@pytest.mark.parametrize("run", ["text", "vectors"])
def test_int96_dates_round_trip_through_query_the_api_and_where(tmp_path, run):
    write_int96(tmp_path / "data" / "a.parquet")
    env = {FAKE_ENGINE_ENV: str(tmp_path / "fake.log")}
    how = ["--model", str(make_fake_model_dir(tmp_path / "model"))] if run == "text" else ["--vectors-column", "emb"]
    out = tmp_path / "out"
    built = invoke(["index", str(tmp_path / "data"), "--out", str(out), "-q", "--keep-columns", "ts,tl", *how],
                   env=env)
    assert built.exit_code == 0, built.output
    dim = 32 if run == "text" else 8
    np.save(tmp_path / "q.npy", np.ones((1, dim), np.float32))
    query = ["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "3", "--json"]
    answer = invoke(query)
    assert answer.exit_code == 0, answer.output
    fields = by_id(answer.stdout)
    assert [fields[i]["ts"] for i in (1, 2, 3)] == SHOWN
    assert [fields[i]["tl"] for i in (1, 2, 3)] == [[s] for s in SHOWN]
    for literal, want in [("9999-12-31", 1), ("0001-01-01", 2), ("2020-05-05", 3)]:
        where = invoke([*query, "--where", f"ts = '{literal}'"])
        assert where.exit_code == 0, where.output
        assert list(by_id(where.stdout)) == [want], (literal, where.stdout)
    hits = petal.open_index(out).search_stored(np.ones((1, dim), np.float32), k=3)[0]
    assert {h.id: h.fields["ts"] for h in hits} == dict(zip([1, 2, 3], DATES))


def test_an_int96_shard_beside_nanoseconds_is_refused_before_any_work(tmp_path):
    """A us-read INT96 is the us timestamp it is: a shard of timestamp[ns] widens the column to nanoseconds, which
    9999-12-31 cannot fit (README: 65 naming the value)."""
    write_int96(tmp_path / "data" / "a.parquet")
    emb = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(8, np.float32)), 8)
    pq.write_table(pa.table({"id": [4], "text": ["x"], "emb": emb, "ts": pa.array([5], pa.timestamp("ns"))}),
                   tmp_path / "data" / "b.parquet")
    built = invoke(["index", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "-q", "--keep-columns", "ts",
                    "--vectors-column", "emb"])
    assert built.exit_code == 65, built.output
    assert "datetime.datetime(9999, 12, 31, 0, 0)" in built.output and "timestamp[ns]" in built.output


def test_an_int96_shard_kept_from_the_live_version_is_read_again_as_the_dates_it_holds(tmp_path):
    """A run naming another source with a new ``--keep-columns`` reads the live version's kept shard again (its
    side file lacks the column): that read's schema said ``timestamp[ns]`` (``pq.read_schema``) while its rows
    came as microseconds."""
    write_int96(tmp_path / "a" / "a.parquet")
    b = tmp_path / "b" / "b.parquet"
    b.parent.mkdir()
    pq.write_table(pa.table({"id": [4], "text": ["stars shine"], "ts": pa.array([DATES[2]], pa.timestamp("us"))}), b)
    env = {FAKE_ENGINE_ENV: str(tmp_path / "fake.log")}
    model = str(make_fake_model_dir(tmp_path / "model"))
    out = tmp_path / "out"
    first = invoke(["index", str(tmp_path / "a"), "--out", str(out), "-q", "--model", model], env=env)
    assert first.exit_code == 0, first.output
    second = invoke(["index", str(tmp_path / "b"), "--out", str(out), "-q", "--model", model, "--keep-columns", "ts"],
                    env=env)
    assert second.exit_code == 0, second.output
    np.save(tmp_path / "q.npy", np.ones((1, 32), np.float32))
    answer = invoke(["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "4", "--json"])
    assert answer.exit_code == 0, answer.output
    fields = by_id(answer.stdout)
    assert [fields[i]["ts"] for i in (1, 2, 3, 4)] == [*SHOWN, SHOWN[2]]
