"""How many requests ``petal index`` makes of object storage, per shard: a real S3-compatible server on loopback
(moto_server, authentication on) logs each request, counted by object.

Before: preflight read each object's footer (a HEAD for its stat, a HEAD to open it, a ranged GET), then its content
identity (``remote_sha256``) opened it again and read the same footer by two more ranged GETs: a rerun with
nothing changed made 6 requests per object (3 GETs of one footer), a first run 17-18. Now the identity is hashed
from the bytes preflight parsed: a rerun makes at most 3 per object, and every object, first or last, as many.
"""

from __future__ import annotations

import collections
import io
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_cli import FAKE_ENGINE_ENV, invoke
from tests.fake_engine import make_fake_model_dir
from tests.s3_server import S3Server, start_s3

pytest.importorskip("moto")

SHARDS = 8
REQUEST = re.compile(r"(GET|HEAD) /(\S+) HTTP/")  # NOTE: moto logs a GET in colour: no word boundary before it


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> tuple[S3Server, Path]:
    """The server and the file it logs each request to."""
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    server = start_s3(log)
    yield server, log
    server.stop()


def _requests(log: Path, start: int) -> tuple[collections.Counter[tuple[str, str]], int]:
    """The GETs and HEADs of objects logged from line ``start`` on, by (method, key), and the listings among them."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    listings = 0
    for line in log.read_text().splitlines()[start:]:
        match = REQUEST.search(line)
        if match is None:
            continue
        method, target = match.groups()
        if "list-type=" in target:
            listings += 1
        else:
            counts[method, target.split("?", 1)[0].split("/", 1)[1]] += 1
    return counts, listings


def test_a_rerun_reads_each_objects_footer_once(s3, tmp_path, monkeypatch):
    s3, log = s3
    s3.client().create_bucket(Bucket="many")
    keys = [f"pre/d{i % 2}/s{i:03d}.parquet" for i in range(SHARDS)]
    for i, key in enumerate(keys):
        buffer = io.BytesIO()
        pq.write_table(pa.table({"id": [f"s{i}-{j}" for j in range(3)],
                                 "text": [f"shard {i} row {j} about rivers" for j in range(3)]}), buffer)
        s3.client().put_object(Bucket="many", Key=key, Body=buffer.getvalue())
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    model = make_fake_model_dir(tmp_path / "model")
    env = {FAKE_ENGINE_ENV: str(tmp_path / "fake.jsonl")}

    def index(source: str, expect: str) -> tuple[collections.Counter[tuple[str, str]], int]:
        start = len(log.read_text().splitlines())
        result = invoke(["index", source, "--out", str(tmp_path / "out"), "--model", str(model), "--id-column", "id"],
                        env=env)
        assert result.exit_code == 0 and expect in result.output, result.output
        return _requests(log, start)

    first, listings = index("s3://many/pre/", f"{SHARDS} added")
    assert listings == 1 and {key for _, key in first} == set(keys), (listings, first)
    per_object = {key: first["GET", key] + first["HEAD", key] for key in keys}
    assert len(set(per_object.values())) == 1, per_object  # the last object costs what the first does
    assert max(per_object.values()) <= 15, first  # before: 17 (the footer read again for the identity)

    for source in ("s3://many/pre/", "s3://many/pre/**/*.parquet"):  # nothing changed: a prefix, a glob
        again, listings = index(source, f"{SHARDS} unchanged")
        assert listings == 1, listings
        for key in keys:  # the stat, the open, one ranged read of the footer; before: HEAD x3, GET x3
            assert again["GET", key] == 1 and again["HEAD", key] <= 2, (source, key, again)
