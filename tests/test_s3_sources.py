"""``s3://`` sources against a real S3-compatible server on loopback (moto_server, authentication on).

Listing a prefix, footer preflight, ranged reads, change detection (size, mtime, footer hash) and
the exit codes of a missing bucket or object (66) and a refused key (78); no credential is ever
written to the store, the index, the report or stderr.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from tests.fake_cli import invoke as fake_invoke
from tests.fake_engine import embedded_ids, make_fake_model_dir
from tests.s3_server import S3Server, start_s3
from tests.test_incremental import contents

pytest.importorskip("moto")


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> S3Server:
    server = start_s3(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def put_shard(s3: S3Server, bucket: str, key: str, prefix: str, rows: int, edition: int = 0) -> list[str]:
    ids = [f"{prefix}-{i}" for i in range(rows)]
    table = pa.table({"id": ids, "text": [f"{prefix} document {i} edition {edition}" for i in range(rows)]})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=5)
    s3.client().put_object(Bucket=bucket, Key=key, Body=buffer.getvalue())
    return ids


def run(argv: list[str], env: dict[str, str]):
    return fake_invoke(argv, env=env)


def test_index_an_s3_prefix_then_reindex_only_the_changed_object(s3, fake_model, tmp_path):
    s3.client().create_bucket(Bucket="corpus")
    ids = []
    for name in "abc":
        ids += put_shard(s3, "corpus", f"shards/{name}.parquet", name, 12)
    put_shard(s3, "corpus", "elsewhere/z.parquet", "z", 3)  # outside the prefix: never read
    out, report = tmp_path / "out", tmp_path / "report.json"
    log1, log2 = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    argv = ["index", "s3://corpus/shards", "--out", str(out), "--model", str(fake_model), "-q",
            "--json-report", str(report)]
    first = run(argv, {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(log1)})
    assert first.exit_code == 0, first.output
    assert sorted(embedded_ids(log1)) == sorted(ids)
    rows, _ = contents(out)
    assert sorted(r["id"] for r in rows) == sorted(ids)
    assert {r["shard"] for r in rows} == {"a.parquet", "b.parquet", "c.parquet"}
    manifest = json.loads(next((out / "versions").glob("*/manifest.json")).read_text())
    assert [s["path"] for s in manifest["shards"]] == [f"s3://corpus/shards/{n}.parquet" for n in "abc"]

    changed = put_shard(s3, "corpus", "shards/b.parquet", "b", 12, edition=1)  # same ids, new texts
    second = run(argv, {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(log2)})
    assert second.exit_code == 0, second.output
    assert sorted(embedded_ids(log2)) == sorted(changed)  # only the changed object is embedded again
    result = json.loads(report.read_text())
    assert result["shards"] == {"total": 3, "embedded": 1, "reused": 2}
    assert result["shard_changes"]["changed"] == ["s3://corpus/shards/b.parquet"]

    # the endpoint in the URI (no AWS_ENDPOINT_URL): stored with it (s3+http://HOST:PORT/...), where the
    # environment's is the default endpoint's (s3://...): other shards, as an endpoint written two ways is two
    # namenodes' (README: write one place the same way in every run); --sync replaces the shards
    env = {k: v for k, v in s3.env().items() if k != "AWS_ENDPOINT_URL"}
    env["PETAL_TEST_FAKE_ENGINE"] = str(tmp_path / "three.jsonl")
    third = run(["index", s3.uri("corpus/shards"), "--out", str(out), "--model", str(fake_model), "-q", "--sync"],
                env)
    assert third.exit_code == 0, third.output
    assert [s.abs_path for s in IndexReader(out).manifest.shards] == [
        f"s3+http://{s3.host_port}/corpus/shards/{n}.parquet" for n in "abc"]

    # no credential anywhere: store, versions, report, output
    for path in [*out.rglob("*"), report]:
        if path.is_file():
            data = path.read_bytes()
            assert s3.secret_key.encode() not in data and s3.access_key.encode() not in data, path
    for result in (first, second, third):
        assert s3.secret_key not in result.output and s3.access_key not in result.output


def test_missing_bucket_object_and_refused_key_exit_codes(s3, fake_model, tmp_path):
    s3.client().create_bucket(Bucket="codes")
    put_shard(s3, "codes", "one.parquet", "one", 4)
    env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}

    def index(source: str, env: dict[str, str]):
        return run(["index", source, "--out", str(tmp_path / "out"), "--model", str(fake_model), "-q"], env)

    missing_bucket = index("s3://no-such-bucket/shards", env)
    assert missing_bucket.exit_code == 66 and "s3://no-such-bucket/shards does not exist" in missing_bucket.output
    missing_object = index("s3://codes/two.parquet", env)
    assert missing_object.exit_code == 66 and "s3://codes/two.parquet" in missing_object.output
    secret = "wRoNgSeCrEt0123456789abcdefghijklmnopqrs"
    refused = index(f"s3://AKIAIMPOSTOR:{secret}@codes/one.parquet", env)  # credentials in the URI
    assert refused.exit_code == 78 and "access denied" in refused.output, refused.output
    assert secret not in refused.output and "AKIAIMPOSTOR" not in refused.output
    wrong_env = index("s3://codes/", {**env, "AWS_SECRET_ACCESS_KEY": secret})
    assert wrong_env.exit_code == 78 and "access denied" in wrong_env.output and secret not in wrong_env.output


def test_s3_shards_store_text_and_kept_columns_and_stay_in_additive_runs(s3, fake_model, tmp_path):
    from petal.pipeline.index.search import IndexReader

    s3.client().create_bucket(Bucket="kept")
    for name in "ab":
        table = pa.table({"id": [f"{name}-{i}" for i in range(6)], "text": [f"{name} text {i}" for i in range(6)],
                          "lang": ["en", "fr"] * 3})
        buffer = io.BytesIO()
        pq.write_table(table, buffer, row_group_size=4)
        s3.client().put_object(Bucket="kept", Key=f"day/{name}.parquet", Body=buffer.getvalue())
    out = tmp_path / "out"
    base = ["--out", str(out), "--model", str(fake_model), "-q", "--keep-columns", "lang"]
    env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log")}
    assert run(["index", "s3://kept/day/a.parquet", *base], env).exit_code == 0
    second = run(["index", "s3://kept/day/b.parquet", *base], env)  # additive: a is kept (by its URI)
    assert second.exit_code == 0, second.output
    reader = IndexReader(out)
    assert reader.ntotal == 12
    hits = reader.search(reader.index.reconstruct_n(0, 12), 1, where="lang = 'fr'")
    assert all(h.fields == {"lang": "fr"} for row in hits for h in row)
    assert sorted(reader.texts([h for row in hits for h in row], "text"))[0].endswith("text 1")


def test_a_prefix_of_objects_not_named_parquet_says_so(s3, fake_model, tmp_path):
    s3.client().create_bucket(Bucket="parq")
    put_shard(s3, "parq", "t/part-0.parq", "p", 2)
    put_shard(s3, "parq", "t/_tmp/part-1.parq", "h", 2)  # hidden: not counted
    env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}
    argv = ["--out", str(tmp_path / "out"), "--model", str(fake_model), "-q"]
    result = run(["index", "s3://parq/t/", *argv], env)
    assert result.exit_code == 66 and "no *.parquet objects under" in result.output, result.output
    assert "holds 1 file that is not named *.parquet" in result.output, result.output
    assert "e.g. s3://parq/t/part-0.parq:" in result.output and "s3://parq/t/*.parq" in result.output, result.output
    assert run(["index", "s3://parq/t/*.parq", *argv], env).exit_code == 0


def test_sync_over_an_emptied_prefix_is_judged_by_the_guard_and_a_typo_stays_66(s3, fake_model, tmp_path):
    """An object store has no empty directories: once a prefix's last object is deleted, the prefix is "not
    found". Under ``--sync`` over a live version that held shards there, that is an emptied corpus (the removal
    guard judges it, as for a local directory); a prefix the live version never held stays 66 (a typo)."""
    client = s3.client()
    client.create_bucket(Bucket="emptied")
    for name in "ab":
        put_shard(s3, "emptied", f"docs/{name}.parquet", name, 6)
    client.put_object(Bucket="emptied", Key="notes/readme.txt", Body=b"not a shard")
    out = tmp_path / "out"
    env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}

    def index(source: str, *flags: str):
        return run(["index", source, "--out", str(out), "--model", str(fake_model), "-q", *flags], env)

    assert index("s3://emptied/docs").exit_code == 0
    for name in "ab":
        client.delete_object(Bucket="emptied", Key=f"docs/{name}.parquet")
    additive = index("s3://emptied/docs")  # without --sync an empty source is no input
    assert additive.exit_code == 66 and "does not exist" in additive.output, additive.output
    guarded = index("s3://emptied/docs", "--sync")
    assert guarded.exit_code == 65 and "would remove 12 of the 12 documents" in guarded.output, guarded.output
    typo = index("s3://emptied/dcos", "--sync", "--max-removed", "100%")
    assert typo.exit_code == 66 and "s3://emptied/dcos does not exist" in typo.output, typo.output
    no_shards = index("s3://emptied/notes", "--sync")  # a prefix that exists but holds no shard: the guard too
    assert no_shards.exit_code == 65 and "would remove 12 of the 12" in no_shards.output, no_shards.output
    mirrored = index("s3://emptied/docs", "--sync", "--max-removed", "100%")
    assert mirrored.exit_code == 0, mirrored.output
    reader = IndexReader(out)
    assert reader.manifest.shards == () and reader.index.ntotal == 0


def test_sync_with_a_glob_matching_nothing_is_66_unless_the_live_version_held_shards_it_matches(s3, fake_model,
                                                                                                  tmp_path):
    """An object store has no directories: a glob that matches nothing under --sync was an emptied corpus whatever it
    named, so a typo in it (or in its prefix) removed every other shard at exit 0. Now, as a prefix SOURCE: it names
    no shard only when the live version holds a shard it matches (the removal guard then judges it); else 66."""
    client = s3.client()
    client.create_bucket(Bucket="globbed")
    for name in "ab":
        put_shard(s3, "globbed", f"docs/{name}.parquet", name, 6)
    put_shard(s3, "globbed", "more/t.parquet/part-0.parquet", "t", 6)  # a table written as a "directory"
    client.put_object(Bucket="globbed", Key="notes/readme.txt", Body=b"not a shard")
    out = tmp_path / "out"
    env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}

    def index(*sources: str, flags: tuple[str, ...] = ("--sync", "--max-removed", "100%")):
        return run(["index", *sources, "--out", str(out), "--model", str(fake_model), "-q", *flags], env)

    assert index("s3://globbed/docs/*.parquet", "s3://globbed/more/*.parquet", flags=()).exit_code == 0
    live = IndexReader(out).manifest.version
    for typo in ["s3://globbed/dcos/*.parquet", "s3://globbed/nodir/**/*.parquet", "s3://globbed/notes/*.parquet",
                 "s3://globbed/docs/*.parqeut", "s3://globbed/docs/sub/*.parquet", "s3://globbed/mor*/t.parquet/x*"]:
        refused = index("s3://globbed/docs/a.parquet", typo)  # was 0: b's and t's documents removed
        assert refused.exit_code == 66, (typo, refused.output)
        assert f"glob {typo} matches no objects, nor any shard of the live version" in refused.output, refused.output
        assert IndexReader(out).manifest.version == live
    for name in "ab":
        client.delete_object(Bucket="globbed", Key=f"docs/{name}.parquet")
    client.delete_object(Bucket="globbed", Key="more/t.parquet/part-0.parquet")
    # the live version held shards these globs match: an emptied corpus, judged by the guard
    guarded = index("s3://globbed/docs/*.parquet", "s3://globbed/more/*.parquet", flags=("--sync",))
    assert guarded.exit_code == 65 and "would remove 18 of the 18 documents" in guarded.output, guarded.output
    assert index("s3://globbed/docs/*.parquet", "s3://globbed/more/*.parquet").exit_code == 0
    reader = IndexReader(out)
    assert reader.manifest.shards == () and reader.index.ntotal == 0


@pytest.mark.parametrize(("change", "point", "hit"), [("replaced", "read_batch", 2), ("removed", "read_batch", 2),
                                                    ("removed", "read_content", 1)])
def test_an_object_replaced_or_removed_mid_read_is_75_and_the_rerun_indexes_what_is_there(s3, fake_model, tmp_path,
                                                                                          change, point, hit):
    """b.parquet is replaced (a new edition) or deleted while petal reads it (its rows read, the run paused at the
    fault point after them), or deleted before its content is hashed (the run paused at a's): exit 75 naming it,
    nothing of it stored; the rerun indexes what the bucket holds then. Before, a replaced object was indexed as a
    success with the old rows' vectors under texts read from the new object, and a removed one was 74, a storage
    failure after retries."""
    import threading
    import time

    client = s3.client()
    bucket = f"midread-{change}-{point.replace('_', '-')}"
    client.create_bucket(Bucket=bucket)
    ids = {name: put_shard(s3, bucket, f"docs/{name}.parquet", name, 6) for name in "abc"}
    out, trace = tmp_path / "out", tmp_path / "trace.txt"
    argv = ["index", f"s3://{bucket}/docs", "--out", str(out), "--model", str(fake_model), "-q"]

    def change_b() -> None:  # once the run sleeps at the point: b's rows read (a's batch, then b's), or a's hash
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if trace.exists() and trace.read_text().split().count(point) >= hit:
                break
            time.sleep(0.02)
        if change == "replaced":
            time.sleep(1.1)  # NOTE: S3's Last-Modified counts whole seconds; the new edition is the same size
            put_shard(s3, bucket, "docs/b.parquet", "b", 6, edition=1)
        else:
            client.delete_object(Bucket=bucket, Key="docs/b.parquet")

    changer = threading.Thread(target=change_b)
    changer.start()
    env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "one.jsonl"), "PETAL_FAULT_TRACE": str(trace),
           "PETAL_FAULT": f"{point}:{hit}:sleep=3"}
    first = run(argv, env)
    changer.join()
    assert first.exit_code == 75, first.output
    last = first.output.strip().splitlines()[-1]
    word = "changed (a new" if change == "replaced" else "was removed"
    assert f"s3://{bucket}/docs/b.parquet {word}" in last and "rerun" in last, last
    assert not (out / "CURRENT").exists()

    second = run(argv, {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "two.jsonl")})
    assert second.exit_code == 0, second.output
    reader = IndexReader(out)
    rows, _ = contents(out)
    expected = ids["a"] + ids["c"] + (ids["b"] if change == "replaced" else [])
    assert sorted(r["id"] for r in rows) == sorted(expected)
    if change == "replaced":  # every stored text of b is the new edition's
        hits = reader.search(reader.index.reconstruct_n(0, reader.ntotal), 1)
        texts = reader.texts([h for row in hits for h in row], "text")
        assert sorted(t for t in texts if t.startswith("b ")) == sorted(f"b document {i} edition 1" for i in range(6))


def test_a_glob_names_the_objects_it_matches_as_a_local_glob_does(s3, fake_model, tmp_path):
    """``s3://bucket/docs/*.parquet``, ``**``: the objects matched (``*`` within a name, never a hidden one), where a
    glob was looked up as one object and failed with 66 'does not exist'. One that matches nothing is 66 saying so."""
    s3.client().create_bucket(Bucket="globbed")
    ids = {}
    for key in ("docs/a.parquet", "docs/b.parquet", "docs/day=2/c.parquet", "docs/.tmp/d.parquet", "other/e.parquet"):
        ids[key] = put_shard(s3, "globbed", key, key.replace("/", "_"), 3)
    s3.client().put_object(Bucket="globbed", Key="docs/notes.txt", Body=b"not a shard")
    env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}

    def indexed(source: str) -> list[str]:
        out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
        result = run(["index", source, "--out", str(out), "--model", str(fake_model), "-q"], env)
        assert result.exit_code == 0, result.output
        return sorted(r["id"] for r in contents(out)[0])

    def expected(*keys: str) -> list[str]:
        return sorted(i for key in keys for i in ids[key])

    assert indexed("s3://globbed/docs/*.parquet") == expected("docs/a.parquet", "docs/b.parquet")
    assert indexed("s3://globbed/docs/**/*.parquet") == expected("docs/a.parquet", "docs/b.parquet",
                                                                 "docs/day=2/c.parquet")
    assert indexed(s3.uri("globbed/*/day=*/*.parquet")) == expected("docs/day=2/c.parquet")
    none = run(["index", "s3://globbed/docs/*.csv", "--out", str(tmp_path / "none"), "--model", str(fake_model)], env)
    assert none.exit_code == 66 and "glob s3://globbed/docs/*.csv matches no objects" in none.output, none.output


def test_an_endpoint_that_accepts_but_never_answers_is_74_in_bounded_time(fake_model, tmp_path):
    """A loopback server that accepts every connection and never sends a byte (a hung S3 gateway, a stopped MinIO
    whose kernel still accepts): exit 74 naming the source in about 10 s (each request: 3 tries of 3 s without a
    byte). Before, FileSystem.from_uri's client retried 10 times with backoff: 74 only after ~100 s."""
    import socket
    import threading
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    closing = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not closing.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    port = listener.getsockname()[1]
    env = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true", "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}
    try:
        started = time.monotonic()
        result = run(["index", f"s3://corpus/shards?endpoint_override=127.0.0.1:{port}&scheme=http", "--out",
                      str(tmp_path / "out"), "--model", str(fake_model), "-q"], env)
        took = time.monotonic() - started
    finally:
        closing.set()
        acceptor.join()
        for conn in held:
            conn.close()
        listener.close()
    assert result.exit_code == 74, result.output
    last = result.output.strip().splitlines()[-1]
    assert "s3://corpus/shards" in last and "storage error" in last and "endpoint_override" not in last, last
    assert took < 30, took


def test_uri_credentials_with_an_unescaped_slash_are_refused_without_showing_them(s3, fake_model, tmp_path):
    """An AWS secret key often holds '/' and '+'. Written into the URI unescaped (s3://KEY:ab/cd@bucket/key), the URI
    parser took the key for the bucket and the rest of the secret for a path: the run failed with 74 'storage error'
    and printed the key and secret, in the URI shown and in the storage's message. Now: 78 saying to percent-encode
    them, nothing of them shown; the percent-encoded URI reads the objects."""
    from urllib.parse import quote

    s3.client().create_bucket(Bucket="slashed")
    ids = put_shard(s3, "slashed", "docs/a.parquet", "a", 4)
    env = {k: v for k, v in s3.env().items() if not k.startswith("AWS_ACCESS") and not k.startswith("AWS_SECRET")}
    env["PETAL_TEST_FAKE_ENGINE"] = str(tmp_path / "log.jsonl")
    secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYzEXAMPLEKEY"
    for source in (f"s3://AKIASLASHED:{secret}@slashed/docs", f"s3://AKIASLASHED:{secret}@slashed/docs?scheme=http"):
        result = run(["index", source, "--out", str(tmp_path / "out"), "--model", str(fake_model), "-q"], env)
        assert result.exit_code == 78, result.output
        last = result.output.strip().splitlines()[-1]
        assert "cannot open s3://slashed/docs" in last and "%2F" in last, last
        assert all(part not in result.output for part in ("AKIASLASHED", "wJalrXUtnFEMI", "K7MDENG", "bPxRfiCYz")), \
            result.output
    encoded = f"s3://{s3.access_key}:{quote(s3.secret_key, safe='')}@slashed/docs"
    result = run(["index", encoded, "--out", str(tmp_path / "out"), "--model", str(fake_model), "-q"], env)
    assert result.exit_code == 0, result.output
    assert sorted(r["id"] for r in contents(tmp_path / "out")[0]) == sorted(ids)
    assert s3.secret_key not in result.output and quote(s3.secret_key, safe="") not in result.output


def test_a_request_refused_as_bad_is_78_not_a_storage_error_to_rerun(s3, fake_model, tmp_path):
    """An invalid or expired session token (AWS_SESSION_TOKEN, as an Airflow connection's expired STS credentials
    leave it): S3 answers a HEAD with a bare 400. Before, that was 74 'storage error ... rerun when the storage
    recovers', though every rerun is refused the same way; now 78 naming the session token and region."""
    s3.client().create_bucket(Bucket="refused")
    put_shard(s3, "refused", "docs/a.parquet", "a", 4)
    env = {**s3.env(), "AWS_SESSION_TOKEN": "not-a-token", "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}
    result = run(["index", "s3://refused/docs", "--out", str(tmp_path / "out"), "--model", str(fake_model), "-q"], env)
    assert result.exit_code == 78, result.output
    last = result.output.strip().splitlines()[-1]
    assert "s3://refused/docs" in last and "refused the request" in last and "AWS_SESSION_TOKEN" in last, last
    assert "not-a-token" not in result.output


def test_a_uri_glob_has_only_star_wildcards_brackets_and_question_marks_are_the_keys_own(s3, fake_model, tmp_path):
    """README: a URI has no ``?`` or ``[...]`` wildcards. Before, fnmatch took ``x[1]*`` for ``x1*`` (indexing
    d/x1.parquet, not d/x[1].parquet) and ``q%3F*`` (``q?*``) for ``q`` and any character (q?.parquet and
    qZ.parquet both)."""
    s3.client().create_bucket(Bucket="brk")
    ids = {key: put_shard(s3, "brk", f"d/{key}", key.replace("[", "(").replace("?", "Q"), 2)
           for key in ("x[1].parquet", "x1.parquet", "q?.parquet", "qZ.parquet")}
    env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}

    def indexed(source: str) -> list[str]:
        out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
        result = run(["index", source, "--out", str(out), "--model", str(fake_model), "-q"], env)
        assert result.exit_code == 0, (source, result.output)
        return sorted(r["id"] for r in contents(out)[0])

    for source in ("s3://brk/d/x[1]*", "s3://brk/d/x%5B1%5D*", "s3://brk/d/*[1].parquet"):
        assert indexed(source) == sorted(ids["x[1].parquet"]), source
    assert indexed("s3://brk/d/q%3F*") == sorted(ids["q?.parquet"])
    assert indexed("s3://brk/d/*1*") == sorted(ids["x[1].parquet"] + ids["x1.parquet"])  # '*' still a wildcard
    nothing = run(["index", "s3://brk/d/x[2]*", "--out", str(tmp_path / "none"), "--model", str(fake_model)], env)
    assert nothing.exit_code == 66 and "matches no objects" in nothing.output, nothing.output


def test_a_uri_ending_in_a_slash_names_the_prefix_never_an_object_of_that_name(s3, fake_model, tmp_path):
    """An object store holds an object ``pk2`` beside objects under ``pk2/``. from_uri drops a trailing '/', and
    ``s3://tsl/pk2/`` indexed the object pk2, ``s3://tsl/pk/a.parquet/`` only the object a.parquet, and
    ``s3://tsl/zz/`` (a zero-byte object zz) failed 65 naming s3://tsl/zz. A URI ending in '/' names every
    ``*.parquet`` below it, as a local directory does; without the '/' the object is still the one named."""
    client = s3.client()
    client.create_bucket(Bucket="tsl")
    ids = {key: put_shard(s3, "tsl", key, key.replace("/", "_"), 2)
           for key in ("pk2", "pk2/x.parquet", "pk/a.parquet", "pk/a.parquet/part-0.parquet", "zz/x.parquet")}
    client.put_object(Bucket="tsl", Key="zz", Body=b"")
    env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}

    def index(source: str):
        out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
        return out, run(["index", source, "--out", str(out), "--model", str(fake_model), "-q"], env)

    def indexed(source: str) -> list[str]:
        out, result = index(source)
        assert result.exit_code == 0, (source, result.output)
        return sorted(r["id"] for r in contents(out)[0])

    def expected(*keys: str) -> list[str]:
        return sorted(i for key in keys for i in ids[key])

    assert indexed("s3://tsl/pk2/") == expected("pk2/x.parquet")
    assert indexed("s3://tsl/pk2") == expected("pk2")  # the object named, as before
    assert indexed("s3://tsl/pk/a.parquet/") == expected("pk/a.parquet/part-0.parquet")
    assert indexed("s3://tsl/zz/") == expected("zz/x.parquet")
    assert indexed(s3.uri("tsl/zz/")) == expected("zz/x.parquet")  # a query string after the '/'
    assert indexed("s3://tsl/pk*/") == expected("pk/a.parquet", "pk/a.parquet/part-0.parquet", "pk2/x.parquet")
    # '**' matches no part too, as a local glob's: the prefix before it is one of the prefixes it names
    assert indexed("s3://tsl/pk/**/") == expected("pk/a.parquet", "pk/a.parquet/part-0.parquet")
    assert indexed("s3://tsl/zz/**/") == expected("zz/x.parquet")
    assert indexed("s3://tsl/**/") == expected("pk2/x.parquet", "pk/a.parquet", "pk/a.parquet/part-0.parquet",
                                             "zz/x.parquet")
    _, missing = index("s3://tsl/nothere/")
    assert missing.exit_code == 66, missing.output
    assert "s3://tsl/nothere/ does not exist (no such bucket or prefix)" in missing.output, missing.output
    _, object_only = index("s3://tsl/pk/a.parquet/part-0.parquet/")  # an object, no prefix of that name
    assert object_only.exit_code == 66 and "does not exist" in object_only.output, object_only.output


def test_an_empty_path_component_is_a_clear_error_in_a_uri_and_in_a_listed_key(s3, fake_model, tmp_path):
    """pyarrow's filesystems refuse a path with an empty component ('a//b'). ``s3://dsl//a`` was exit 1, an internal
    error (ArrowInvalid) with a traceback; now 66 naming the URI (it names nothing petal can read). A key that holds
    one (``dd//x.parquet``, which S3 lists) failed the run 65 'not a readable Parquet file' at preflight; now 65 at
    listing naming the key, as a file whose name is not UTF-8 is, never skipped silently."""
    s3.client().create_bucket(Bucket="dsl")
    put_shard(s3, "dsl", "a", "a", 2)
    put_shard(s3, "dsl", "dd/y.parquet", "y", 2)
    put_shard(s3, "dsl", "dd//x.parquet", "x", 2)
    put_shard(s3, "dsl", "ok/z.parquet", "z", 2)
    env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}

    def index(source: str):
        return run(["index", source, "--out", str(tmp_path / "out"), "--model", str(fake_model), "-q"], env)

    for source in ("s3://dsl//a", "s3://dsl//a*", s3.uri("dsl/ok//z.parquet")):
        result = index(source)
        assert result.exit_code == 66, (source, result.output)
        last = result.output.strip().splitlines()[-1]
        assert "empty path component" in last and source.split("?")[0] in last, last
        assert "endpoint_override" not in result.output
    for source in ("s3://dsl/dd", "s3://dsl/dd/", "s3://dsl/**/*.parquet"):
        result = index(source)
        assert result.exit_code == 65, (source, result.output)
        last = result.output.strip().splitlines()[-1]
        assert "s3://dsl/dd//x.parquet: an object key with an empty path component" in last, last
    assert index("s3://dsl/ok").exit_code == 0


def test_full_with_a_kept_object_deleted_is_78_with_the_sync_hint_as_for_a_local_file(s3, fake_model, tmp_path):
    """``--full`` re-embeds every shard of the index, kept ones too. A kept local file gone is 78 saying to pass
    --sync; a kept object deleted from the bucket was listed again as a source and failed 66 'source
    s3://full/p/a.parquet does not exist'. Now the same 78, naming it; one still there is embedded again."""
    client = s3.client()
    client.create_bucket(Bucket="full")
    put_shard(s3, "full", "p/a.parquet", "a", 4)
    b_ids = put_shard(s3, "full", "p/b.parquet", "b", 4)
    put_shard(s3, "full", "q/c.parquet", "c", 4)
    out = tmp_path / "out"
    env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}

    def index(source: str, *flags: str):
        return run(["index", source, "--out", str(out), "--model", str(fake_model), "-q", *flags], env)

    assert index("s3://full/p").exit_code == 0
    assert index("s3://full/q").exit_code == 0  # additive: p's shards are kept
    kept = index("s3://full/q", "--full")  # both kept objects there: embedded again
    assert kept.exit_code == 0, kept.output
    client.delete_object(Bucket="full", Key="p/a.parquet")
    for source in ("s3://full/p", "s3://full/q"):
        gone = index(source, "--full")
        assert gone.exit_code == 78, gone.output
        last = gone.output.strip().splitlines()[-1]
        assert "s3://full/p/a.parquet (kept from an earlier run) is gone; pass --sync" in last, last
    synced = index("s3://full/p", "--full", "--sync", "--max-removed", "100%")
    assert synced.exit_code == 0, synced.output
    assert sorted(r["id"] for r in contents(out)[0]) == sorted(b_ids)  # q's shard, not named, dropped with a's


def test_full_embeds_again_kept_objects_whose_keys_hold_url_characters(s3, fake_model, tmp_path):
    """A kept object was listed again by its key as it reads: g/h#1.parquet named s3://bkt/g/h (66 'does not
    exist'), g/q?.parquet a query string (78), g/p%41.parquet the key g/pA.parquet (66). Each is named escaped."""
    client = s3.client()
    client.create_bucket(Bucket="fullkeys")
    keys = ["g/h#1.parquet", "g/q?.parquet", "g/p%41.parquet", "g/s p.parquet"]
    kept_ids = sorted(i for key in keys for i in put_shard(s3, "fullkeys", key, key[2], 2))
    d_ids = put_shard(s3, "fullkeys", "d/a.parquet", "d", 2)
    out = tmp_path / "out"
    env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}

    def index(source: str, *flags: str):
        return run(["index", source, "--out", str(out), "--model", str(fake_model), "-q", *flags], env)

    assert index("s3://fullkeys/g").exit_code == 0
    assert index("s3://fullkeys/d").exit_code == 0
    full = index("s3://fullkeys/d", "--full")
    assert full.exit_code == 0, full.output
    assert sorted(r["id"] for r in contents(out)[0]) == sorted([*kept_ids, *d_ids])


def test_a_url_for_a_flag_that_takes_a_local_path_is_a_usage_error_naming_it(s3, fake_model, tmp_path):
    """Only a SOURCE is read from object storage. A URL given to a path flag was taken for a local path with its '//'
    folded: ``--delete s3://bkt/del/ids.parquet`` was 66 '--delete s3:/bkt/del/ids.parquet: no such file' (the
    object there), ``--out s3://...`` a local directory 's3:'. Now 2 naming the URL as given (no credentials)."""
    s3.client().create_bucket(Bucket="flags")
    put_shard(s3, "flags", "a/x.parquet", "x", 2)
    put_shard(s3, "flags", "del/ids.parquet", "x", 1)
    env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}
    out, model = str(tmp_path / "out"), str(fake_model)
    url = "s3://flags/del/ids.parquet"
    cases = [
        ("--delete", ["index", "s3://flags/a", "--out", out, "--model", model, "--delete", url]),
        ("--delete", ["index", "s3://flags/a", "--out", out, "--model", model, "--delete",
                      "s3://AKIAFLAG:sEcReT@flags/del/ids.parquet?region=us-east-1"]),
        ("--out", ["index", "s3://flags/a", "--out", "s3://flags/del/ids.parquet", "--model", model]),
        ("--json-report", ["index", "s3://flags/a", "--out", out, "--model", model, "--json-report", url]),
        ("--input", ["embed", "--input", url, "--model", model]),
        ("--vector-file", ["query", out, "--vector-file", url]),
        ("INDEX", ["info", "gs://flags/del/ids.parquet"]),
    ]
    for flag, argv in cases:
        result = run(argv, env)
        assert result.exit_code == 2, (argv, result.output)
        shown = "gs://flags/del/ids.parquet" if flag == "INDEX" else url
        assert f"{shown} is a URL; this takes a local path" in result.output and flag in result.output, result.output
        assert "s3:/flags" not in result.output and "sEcReT" not in result.output and "AKIAFLAG" not in result.output
        assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists() and not Path("s3:").exists()
    local = run(["index", "s3://flags/a", "--out", out, "--model", model, "-q", "--json-report",
                 f"file://{tmp_path / 'r.json'}"], env)  # a file:// URL is the local path it names, as before
    assert local.exit_code == 0 and (tmp_path / "r.json").is_file(), local.output


def test_a_fragment_no_bucket_and_an_upper_case_scheme(s3, fake_model, tmp_path):
    """``#`` ends a URI's path (its fragment): s3://b/k/h#1.parquet read the object k/h at exit 0, a glob lost its
    tail; now 66 saying to write %23, as a file:// URL's. ``s3://`` (a bucket variable unset) listed every bucket the
    key reaches at exit 0; now 66. ``S3://`` was 78 'Unrecognized filesystem type ... s3://'; a scheme is
    case-insensitive."""
    s3.client().create_bucket(Bucket="frag")
    put_shard(s3, "frag", "k/h", "wrong", 2)
    right = put_shard(s3, "frag", "k/h#1.parquet", "right", 2)
    env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")}

    def index(source: str, out: str = "out"):
        return run(["index", source, "--out", str(tmp_path / out), "--model", str(fake_model), "-q"], env)

    for source in ("s3://frag/k/h#1.parquet", "s3://frag/k/*#1.parquet"):
        result = index(source)
        last = result.output.strip().splitlines()[-1]
        assert result.exit_code == 66 and "write '#' in a key as %23" in last, (source, result.output)
    assert not (tmp_path / "out").exists()
    result = index("s3://")
    assert result.exit_code == 66 and "names no bucket" in result.output, result.output
    assert index("s3://frag/k/h%231.parquet").exit_code == 0  # the key, escaped
    assert IndexReader(tmp_path / "out").ids.column("id").to_pylist() == right
    assert index("S3://frag/k/h%231.parquet", "upper").exit_code == 0
    assert IndexReader(tmp_path / "upper").ids.column("id").to_pylist() == right
