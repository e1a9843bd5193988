"""A directory or prefix SOURCE reads every ``*.parquet`` below it in any case: ``B.PARQUET`` or ``c.Parquet``
(written by tools that upper-case names) were skipped without a word, their rows never indexed, exit 0. Hidden
names (``_x.PARQUET``) stay skipped, as lower-case ones are.

Real Parquet, a real S3-compatible server (moto) on loopback, the fake engine (tests/fake_engine.py)."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_cli import invoke
from tests.fake_engine import embedded_ids, make_fake_model_dir

NAMES = {"a.parquet": "a", "B.PARQUET": "b", "sub/c.Parquet": "c", "_x.PARQUET": None, "notes.txt": None,
         "t.parquet/PART-0.PARQUET": "t"}
FOUND = ["a", "b", "c", "t"]


def _table(doc_id: str) -> pa.Table:
    return pa.table({"id": [doc_id], "text": [f"document {doc_id}"]})


def _index(tmp_path: Path, *sources: str, env: dict[str, str] | None = None, out: str = "out"):
    log = tmp_path / "fake.log"
    log.unlink(missing_ok=True)
    result = invoke(["index", *sources, "--out", str(tmp_path / out), "-q", "--model",
                     str(make_fake_model_dir(tmp_path / "model"))],
                    env={**(env or {}), "PETAL_TEST_FAKE_ENGINE": str(log)})
    return result, log


@pytest.mark.parametrize("how", ["directory", "glob"])
def test_a_directory_reads_parquet_names_in_any_case(tmp_path, how):
    data = tmp_path / "data"
    for name, doc_id in NAMES.items():
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".txt"):
            (data / name).write_text("not a shard")
        else:
            pq.write_table(_table(doc_id or "hidden"), data / name)
    source = str(data) if how == "directory" else str(data / "*.parquet")
    result, log = _index(tmp_path, source)
    assert result.exit_code == 0, result.output
    expected = FOUND if how == "directory" else ["a", "t"]  # a glob names what it matches (t.parquet/: a directory)
    assert sorted(embedded_ids(log)) == expected


def test_a_prefix_reads_parquet_names_in_any_case(tmp_path_factory, tmp_path):
    pytest.importorskip("moto")
    from tests.s3_server import start_s3

    server = start_s3(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        client = server.client()
        client.create_bucket(Bucket="corpus")
        for name, doc_id in NAMES.items():
            buffer = io.BytesIO()
            if not name.endswith(".txt"):
                pq.write_table(_table(doc_id or "hidden"), buffer)
            client.put_object(Bucket="corpus", Key=f"up/{name}", Body=buffer.getvalue())
        for n, (source, expected) in enumerate((("s3://corpus/up", FOUND), ("s3://corpus/up/t.*", ["t"]))):
            result, log = _index(tmp_path, source, env=server.env(), out=f"out{n}")
            assert result.exit_code == 0, result.output
            assert sorted(embedded_ids(log)) == expected, source
    finally:
        server.stop()
