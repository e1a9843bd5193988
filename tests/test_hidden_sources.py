"""A directory SOURCE (or object-store prefix) names the ``*.parquet`` files below it whose path there has no part
starting with ``.`` or ``_``, as pyarrow's datasets, Spark and Hive read a table directory. Before: every
``*.parquet`` below was a shard, so a cron run over a Spark table indexed the ``_temporary/`` attempt files of a job
still writing (kept forever by later additive runs once the job moved them), and a Delta table directory failed
(65) on ``_delta_log/*.checkpoint.parquet``, which has no text column. A glob's wildcards (``*``, ``**``), local or
in object storage, skip them too (``data/**/*.parquet`` read ``data/_temporary/``); a file the user names, a glob's
literal part or a wildcard part starting with ``.`` or ``_`` is still read whatever its name."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_cli import invoke
from tests.fake_engine import embedded_ids, make_fake_model_dir


def table(ids: list[str]) -> pa.Table:
    return pa.table({"id": ids, "text": [f"document {i}" for i in ids]})


def write(path: Path, t: pa.Table) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(t, path)
    return path


def spark_table(root: Path) -> None:
    write(root / "part-0.parquet", table(["a", "b"]))
    write(root / "_temporary" / "0" / "_temporary" / "attempt_1" / "part-1.parquet", table(["c"]))
    write(root / "_delta_log" / "00000000000000000010.checkpoint.parquet", pa.table({"add": [1]}))
    write(root / ".part-0.parquet", table(["d"]))  # a copy or an editor's file beside it
    write(root / "nested" / "part-2.parquet", table(["e"]))
    (root / "_SUCCESS").write_bytes(b"")


def index(tmp_path: Path, *sources: str | Path, env: dict | None = None):
    log = tmp_path / "fake.log"
    return invoke(["index", *map(str, sources), "--out", str(tmp_path / "out"), "-q",
                   "--model", str(make_fake_model_dir(tmp_path / "model"))],
                  env={**(env or {}), "PETAL_TEST_FAKE_ENGINE": str(log)}), log


def test_a_directory_source_skips_hidden_and_underscore_paths(tmp_path):
    spark_table(tmp_path / "table")
    result, log = index(tmp_path, tmp_path / "table")
    assert result.exit_code == 0, result.output
    assert sorted(embedded_ids(log)) == ["a", "b", "e"]


def test_a_file_or_glob_named_is_read_whatever_its_name(tmp_path):
    spark_table(tmp_path / "table")
    attempt = tmp_path / "table" / "_temporary" / "0" / "_temporary" / "attempt_1" / "part-1.parquet"
    result, log = index(tmp_path, attempt, tmp_path / "table" / ".part-0.parquet")
    assert result.exit_code == 0, result.output
    assert sorted(embedded_ids(log)) == ["c", "d"]


def test_an_object_store_prefix_skips_them_too(tmp_path):
    pytest.importorskip("moto")
    from tests.s3_server import start_s3

    server = start_s3(tmp_path / "moto.log")
    try:
        client = server.client()
        client.create_bucket(Bucket="corpus")
        for key, ids in (("t/part-0.parquet", ["a"]), ("t/_temporary/0/part-1.parquet", ["c"]),
                         ("t/.hidden/part-2.parquet", ["d"]), ("t/x/part-3.parquet", ["e"])):
            buffer = io.BytesIO()
            pq.write_table(table(ids), buffer)
            client.put_object(Bucket="corpus", Key=key, Body=buffer.getvalue())
        result, log = index(tmp_path, "s3://corpus/t", env=server.env())
        assert result.exit_code == 0, result.output
        assert sorted(embedded_ids(log)) == ["a", "e"]
        manifest = json.loads(next((tmp_path / "out" / "versions").glob("*/manifest.json")).read_text())
        assert [s["path"] for s in manifest["shards"]] == ["s3://corpus/t/part-0.parquet", "s3://corpus/t/x/part-3.parquet"]
    finally:
        server.stop()


def test_a_directory_whose_only_shards_are_skipped_says_where_they_are(tmp_path):
    """A directory SOURCE whose ``*.parquet`` files all lie under ``.``/``_`` paths (a Spark job still writing: only
    ``_temporary/``) is still 66, saying how many were skipped and one of them (it said only 'no *.parquet files
    under directory', which sent a user looking for files that are there)."""
    root = tmp_path / "job"
    write(root / "_temporary" / "0" / "part-0.parquet", table(["a"]))
    write(root / "sub" / ".part-1.parquet", table(["b"]))
    result, _ = index(tmp_path, root)
    assert result.exit_code == 66, result.output
    assert "no *.parquet files under directory" in result.output
    assert "2 *.parquet files are under paths starting with '.' or '_'" in result.output, result.output
    assert "_temporary/0/part-0.parquet" in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    result, _ = index(tmp_path, empty)
    assert result.exit_code == 66 and "starting with" not in result.output, result.output


def test_a_file_url_source_is_the_local_path(tmp_path):
    """``file:///abs/dir`` (and ``file://localhost/...``, percent-escapes decoded) is the local path it names; it was
    66 'URL schemes are not supported'. A ``file://`` URL of another host is 66 saying so."""
    write(tmp_path / "my data" / "part-0.parquet", table(["a", "b"]))
    url = "file://" + str(tmp_path / "my data").replace(" ", "%20")
    result, log = index(tmp_path, url)
    assert result.exit_code == 0, result.output
    assert sorted(embedded_ids(log)) == ["a", "b"]
    result, _ = index(tmp_path, "file://localhost" + str(tmp_path / "my data" / "part-0.parquet"))
    assert result.exit_code == 0, result.output
    result, _ = index(tmp_path, "file://elsewhere/data")
    assert result.exit_code == 66 and "another host" in result.output, result.output


def test_a_file_url_is_the_local_path_for_every_path_flag(tmp_path):
    """``--delete file:///...`` and ``petal embed --input file:///...`` (any path flag or argument) name the local file,
    as a SOURCE does; they were 'file:/...: no such file' (66). Another host's URL is a usage error (2)."""
    write(tmp_path / "data" / "part-0.parquet", table(["a", "b"]))
    pq.write_table(pa.table({"id": ["a"]}), tmp_path / "del me.parquet")
    url = "file://" + str(tmp_path / "del me.parquet").replace(" ", "%20")
    result, _ = index(tmp_path, tmp_path / "data")
    assert result.exit_code == 0, result.output
    result, _ = index(tmp_path, tmp_path / "data", "--delete", url)
    assert result.exit_code == 0, result.output
    from petal.pipeline.index.search import IndexReader

    assert IndexReader(tmp_path / "out").ids.column("id").to_pylist() == ["b"]
    result, _ = index(tmp_path, tmp_path / "data", "--delete", "file://elsewhere/d.parquet")
    assert result.exit_code == 2 and "another host" in result.output, result.output


def test_a_file_url_with_a_query_or_fragment_is_refused_not_cut_short(tmp_path):
    """A ``file://`` URL's path ends at an unescaped ``#`` or ``?``: ``file:///d/my docs#1`` read ``/d/my docs``
    (another directory) and ``--out file:///x#2`` wrote ``/x``, both at exit 0. Refused (66 as a SOURCE, 2 as a path
    flag), saying how to escape them; ``%23`` names the directory meant; the host is case-insensitive."""
    write(tmp_path / "my docs#1" / "part-0.parquet", table(["a", "b"]))
    write(tmp_path / "my docs" / "part-0.parquet", table(["c"]))
    base = "file://" + str(tmp_path).replace(" ", "%20")
    for url in (base + "/my%20docs#1", base + "/my%20docs/?art-0.parquet", base + "/my%20docs?x=1"):
        result, log = index(tmp_path, url)
        escape = "%23" if "#" in url else "%3F"
        assert result.exit_code == 66 and escape in result.output and "local path" in result.output, \
            (url, result.output)
        assert not (tmp_path / "out").exists()
    result, log = index(tmp_path, base + "/my%20docs%231")
    assert result.exit_code == 0, result.output
    assert sorted(embedded_ids(log)) == ["a", "b"]
    result, log = index(tmp_path, "file://LOCALHOST" + str(tmp_path / "my docs#1").replace("#", "%23"))
    assert result.exit_code == 0, result.output
    result, _ = index(tmp_path, tmp_path / "my docs", "--delete", base + "/d.parquet#2")
    assert result.exit_code == 2 and "fragment" in result.output, result.output


@pytest.mark.parametrize("names", [["a.parq", "b.pq"], ["000000_0"], ["x.PQ", "notes.txt"]])
def test_a_directory_of_files_not_named_parquet_says_so_and_a_glob_or_name_reads_them(tmp_path, names):
    # NOTE: 'no *.parquet files under directory d' alone, over files that are Parquet (.parq, .pq, Hive's 000000_0)
    for i, name in enumerate(names):
        write(tmp_path / "d" / name, table([f"r{i}"]))
    result, _ = index(tmp_path, tmp_path / "d")
    assert result.exit_code == 66, result.output
    example = tmp_path / "d" / names[0]
    assert f"holds {len(names)} file" in result.output and "not named *.parquet" in result.output, result.output
    assert str(example) in result.output, result.output
    suffix = Path(names[0]).suffix
    if suffix:
        assert f"glob such as \"{tmp_path / 'd'}/*{suffix}\"" in result.output, result.output
        named, log = index(tmp_path, f"{tmp_path / 'd'}/*{suffix}")
        assert named.exit_code == 0, named.output
    else:
        named, log = index(tmp_path, example)
        assert named.exit_code == 0, named.output
    assert "r0" in embedded_ids(log)


def test_only_hidden_parquet_files_keep_their_own_hint(tmp_path):
    write(tmp_path / "d" / "_temporary" / "part-0.parquet", table(["a"]))
    write(tmp_path / "d" / "_temporary" / "part-0.crc", table(["a"]))
    result, _ = index(tmp_path, tmp_path / "d")
    assert result.exit_code == 66 and "under paths starting with '.' or '_'" in result.output, result.output
    assert "not named *.parquet" not in result.output


def lake(root: Path) -> None:
    """A table directory with hidden parts at every depth a wildcard reaches."""
    write(root / "part-0.parquet", table(["a", "b"]))
    write(root / "nested" / "part-2.parquet", table(["e"]))
    write(root / "_temporary" / "0" / "part-1.parquet", table(["c"]))  # a Spark job still writing
    write(root / "_staging" / "part-4.parquet", table(["g"]))
    write(root / "_x.parquet", table(["f"]))
    write(root / ".hidden" / "part-3.parquet", table(["d"]))
    write(root / "nested" / "_delta_log" / "0.checkpoint.parquet", pa.table({"add": [1]}))


@pytest.mark.parametrize(("pattern", "ids"), [
    ("**/*.parquet", ["a", "b", "e"]), ("*/*.parquet", ["e"]), ("*.parquet", ["a", "b"]), ("**", ["a", "b", "e"]),
    ("*", ["a", "b", "e"]),  # 'nested' matched: read as a directory SOURCE
    # a hidden part the pattern names itself (literally, or a wildcard part starting with '_' or '.') is read
    ("_staging/*.parquet", ["g"]), ("_*/*.parquet", ["g"]), ("_temporary/**/*.parquet", ["c"]), ("_x.parquet", ["f"]),
    ("_*.parquet", ["f"]), (".hidden/*.parquet", ["d"]), ("**/_staging/*.parquet", ["g"]),
])
def test_a_local_glob_skips_hidden_parts_its_wildcards_would_match(tmp_path, pattern, ids):
    """``data/**/*.parquet`` (and ``*``) matched ``_temporary/``, ``_staging/``, ``_x.parquet`` and Delta's
    ``_delta_log/``: a job's attempt files indexed, a checkpoint failing the run (65). A wildcard matches no name
    starting with '.' or '_' unless its part starts so itself, as a directory SOURCE skips them."""
    lake(tmp_path / "data")
    result, log = index(tmp_path, f"{tmp_path / 'data'}/{pattern}")
    assert result.exit_code == 0, result.output
    assert sorted(embedded_ids(log)) == ids


def test_a_local_glob_whose_matches_are_all_hidden_says_where_they_are(tmp_path):
    write(tmp_path / "job" / "_temporary" / "0" / "part-0.parquet", table(["a"]))
    write(tmp_path / "job" / "sub" / ".part-1.parquet", table(["b"]))
    result, _ = index(tmp_path, f"{tmp_path / 'job'}/**/*.parquet")
    assert result.exit_code == 66, result.output
    assert "matches no files" in result.output, result.output
    assert "2 *.parquet files are under paths starting with '.' or '_', which a glob skips" in result.output, \
        result.output
    assert str(tmp_path / "job" / "_temporary" / "0" / "part-0.parquet") in result.output, result.output
    result, log = index(tmp_path, f"{tmp_path / 'job'}/_temporary/**/*.parquet")
    assert result.exit_code == 0, result.output
    assert embedded_ids(log) == ["a"]


def put_lake(client, bucket: str, prefix: str) -> None:
    for key, ids in (("part-0.parquet", ["a"]), ("nested/part-2.parquet", ["e"]),
                     ("_temporary/0/part-1.parquet", ["c"]), ("_staging/part-4.parquet", ["g"]),
                     ("_x.parquet", ["f"]), (".hidden/part-3.parquet", ["d"])):
        buffer = io.BytesIO()
        pq.write_table(table(ids), buffer)
        client.put_object(Bucket=bucket, Key=prefix + key, Body=buffer.getvalue())


def test_an_object_store_glob_skips_hidden_parts_as_a_local_glob_does(tmp_path):
    pytest.importorskip("moto")
    from tests.s3_server import start_s3

    server = start_s3(tmp_path / "moto.log")
    try:
        client = server.client()
        client.create_bucket(Bucket="corpus")
        put_lake(client, "corpus", "t/")
        put_lake(client, "corpus", "only/_temporary/")
        for n, (pattern, ids) in enumerate([
                ("t/**/*.parquet", ["a", "e"]), ("t/*/*.parquet", ["e"]), ("t/*.parquet", ["a"]), ("t/*", ["a", "e"]),
                ("t/_staging/*.parquet", ["g"]), ("t/_*/*.parquet", ["g"]), ("t/_*.parquet", ["f"]),
                ("t/**/_temporary/**/*.parquet", ["c"])]):
            (tmp_path / str(n)).mkdir()
            result, log = index(tmp_path / str(n), f"s3://corpus/{pattern}", env=server.env())
            assert result.exit_code == 0, (pattern, result.output)
            assert sorted(embedded_ids(log)) == ids, pattern
        (tmp_path / "g").mkdir()
        (tmp_path / "p").mkdir()
        result, _ = index(tmp_path / "g", "s3://corpus/only/**/*.parquet", env=server.env())
        assert result.exit_code == 66 and "matches no objects" in result.output, result.output
        assert "6 *.parquet files are under paths starting with '.' or '_', which a glob skips" in result.output, \
            result.output
        assert "s3://corpus/only/_temporary/.hidden/part-3.parquet" in result.output, result.output
        result, _ = index(tmp_path / "p", "s3://corpus/only/", env=server.env())
        assert result.exit_code == 66 and "no *.parquet objects under" in result.output, result.output
        assert "6 *.parquet files are under paths starting with '.' or '_', which a prefix SOURCE skips" \
            in result.output, result.output
    finally:
        server.stop()
