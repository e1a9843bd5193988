"""A kept timestamp whose time zone this machine cannot resolve: refused at index time, shown as UTC from an index
made before.

Before: ``--keep-columns ts`` of a ``timestamp[us, tz=UTC+3]`` (or 'Eastern Standard Time', or a list of them)
exited 0, then every query was a traceback ('The zoneinfo module or pytz package must be installed.', exit 1) and
the API raised ArrowInvalid; a ``--vectors-column`` run's text column of such a type was 65 'corrupt data' only
after the vectors were stored. Real Parquet, the fake engine and ``--vectors-column`` runs, the CLI and the API."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.jobs import keep_columns
from tests.fake_cli import invoke


def write(path: Path, **columns: pa.Array) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    emb = pa.FixedSizeListArray.from_arrays(pa.array(np.eye(2, 8, dtype=np.float32).ravel()), 8)
    pq.write_table(pa.table({"id": [1, 2], "text": ["glaciers move", "cat sat"], "emb": emb, **columns}), path)
    return path.parent


ZONED = {
    "UTC+3": pa.array([0, 10**6], pa.timestamp("us", tz="UTC+3")),
    "Eastern Standard Time": pa.array([[0], [10**6]], pa.list_(pa.timestamp("ms", tz="Eastern Standard Time"))),
}


@pytest.mark.parametrize("zone", list(ZONED))
def test_an_unresolvable_zone_is_refused_before_any_work_naming_shard_column_and_zone(tmp_path, zone):
    data = write(tmp_path / "data" / "a.parquet", ts=ZONED[zone])
    built = invoke(["index", str(data), "--out", str(tmp_path / "out"), "-q", "--vectors-column", "emb",
                    "--keep-columns", "ts"])
    assert built.exit_code == 65, built.output
    assert "a.parquet: --keep-columns 'ts' is" in built.output and f"time zone {zone!r} cannot be resolved" in \
        built.output
    assert not (tmp_path / "out" / "versions").exists()


def test_a_vectors_run_text_column_of_such_a_zone_is_refused_before_any_work(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    emb = pa.FixedSizeListArray.from_arrays(pa.array(np.eye(2, 8, dtype=np.float32).ravel()), 8)
    pq.write_table(pa.table({"id": [1, 2], "emb": emb, "text": ZONED["UTC+3"]}), data / "a.parquet")
    built = invoke(["index", str(data), "--out", str(tmp_path / "out"), "-q", "--vectors-column", "emb"])
    assert built.exit_code == 65, built.output
    assert "--text-column 'text'" in built.output and "time zone 'UTC+3' cannot be resolved" in built.output
    assert "corrupt" not in built.output


def test_an_index_made_before_shows_such_values_as_utc(tmp_path, monkeypatch):
    data = write(tmp_path / "data" / "a.parquet", ts=ZONED["UTC+3"], tl=ZONED["Eastern Standard Time"])
    with monkeypatch.context() as patched:  # what an index made before the check holds
        patched.setattr(keep_columns, "unresolved_zone", lambda type_: None)
        built = invoke(["index", str(data), "--out", str(tmp_path / "out"), "-q", "--vectors-column", "emb",
                        "--keep-columns", "ts,tl"])
    assert built.exit_code == 0, built.output
    np.save(tmp_path / "q.npy", np.eye(2, 8, dtype=np.float32))
    answer = invoke(["query", str(tmp_path / "out"), "--vector-file", str(tmp_path / "q.npy"), "-k", "1", "--json"])
    assert answer.exit_code == 0, answer.output
    fields = [json.loads(line)["hits"][0]["fields"] for line in answer.stdout.splitlines()]
    assert fields == [{"ts": "1970-01-01 00:00:00+00:00", "tl": ["1970-01-01 00:00:00+00:00"]},
                      {"ts": "1970-01-01 00:00:01+00:00", "tl": ["1970-01-01 00:16:40+00:00"]}]
    hits = petal.open_index(tmp_path / "out").search_stored(np.eye(2, 8, dtype=np.float32), k=1)
    assert hits[1][0].fields["ts"] == datetime(1970, 1, 1, 0, 0, 1, tzinfo=timezone.utc)
