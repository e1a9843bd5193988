"""``hdfs://`` sources on emulated namenodes (tests/hdfs_emulation.py: libhdfs and a JVM cannot run in CI).

Arrow's HadoopFileSystem names an entry by its path without the namenode (``/data/x``), so petal stored
``hdfs:///data/shards/a.parquet`` for a shard of ``hdfs://nn1:8020``: a later run or a search read it from the
default namenode, and two namenodes' shards of one path were one shard. A stored URI now keeps the namenode.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from tests.fake_cli import invoke
from tests.fake_engine import make_fake_model_dir
from tests.hdfs_emulation import emulate_hdfs


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def put(root: Path, path: str, prefix: str, rows: int) -> list[str]:
    """A shard at ``path`` (``/data/...``) of the namenode stored under ``root``; its ids."""
    ids = [f"{prefix}-{i}" for i in range(rows)]
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "text": [f"{prefix} document {i}" for i in range(rows)],
                             "lang": [prefix] * rows}), target)
    return ids


@pytest.fixture
def namenodes(tmp_path, monkeypatch) -> dict[str, Path]:
    """nn1 (the default namenode, fs.defaultFS), nn2 and nn0; each a local directory."""
    nodes = {name: tmp_path / name for name in ("nn0:8020", "nn1:8020", "nn2:8020")}
    for root in nodes.values():
        root.mkdir()
    emulate_hdfs(monkeypatch, nodes, default="nn0:8020")
    return nodes


def index(out: Path, model: Path, log: Path, *args: str):
    return invoke(["index", *args, "--out", str(out), "--model", str(model), "-q", "--keep-columns", "lang"],
                  env={"PETAL_TEST_FAKE_ENGINE": str(log)})


def stored(out: Path) -> list[str]:
    return sorted(record.abs_path for record in IndexReader(out).manifest.shards)


def indexed_ids(out: Path) -> list[str]:
    return sorted(IndexReader(out).ids.column("id").to_pylist())


def test_two_namenodes_with_the_same_paths_are_two_sets_of_shards(namenodes, fake_model, tmp_path):
    """Before: nn2's shards were dropped without a word (one stored URI, hdfs:///data/shards/a.parquet, for both)."""
    one = put(namenodes["nn1:8020"], "/data/shards/a.parquet", "one", 4)
    two = put(namenodes["nn2:8020"], "/data/shards/a.parquet", "two", 5)
    out = tmp_path / "out"
    result = index(out, fake_model, tmp_path / "log", "hdfs://nn1:8020/data/shards", "hdfs://nn2:8020/data/shards")
    assert result.exit_code == 0, result.output
    assert stored(out) == ["hdfs://nn1:8020/data/shards/a.parquet", "hdfs://nn2:8020/data/shards/a.parquet"]
    assert indexed_ids(out) == sorted(one + two)


def test_kept_shards_are_read_from_their_own_namenode_by_full_and_by_search(namenodes, fake_model, tmp_path):
    """Before: --full and a search's metadata read a kept nn1 shard from the default namenode (nn0), which holds
    another file at that path: indexed at exit 0 as if it were nn1's, and every hit's metadata 'changed'."""
    one = put(namenodes["nn1:8020"], "/data/shards/a.parquet", "one", 4)
    more = put(namenodes["nn1:8020"], "/data/more/b.parquet", "more", 3)
    put(namenodes["nn0:8020"], "/data/shards/a.parquet", "other", 6)  # the default namenode: never read
    out, log = tmp_path / "out", tmp_path / "log"
    assert index(out, fake_model, log, "hdfs://nn1:8020/data/shards").exit_code == 0
    full = index(out, fake_model, log, "hdfs://nn1:8020/data/more", "--full")
    assert full.exit_code == 0, full.output
    assert stored(out) == ["hdfs://nn1:8020/data/more/b.parquet", "hdfs://nn1:8020/data/shards/a.parquet"]
    assert indexed_ids(out) == sorted(one + more)
    reader = IndexReader(out)
    hits = [row[0] for row in reader.search(reader.index.reconstruct_n(0, reader.ntotal), 1)]
    records = reader.records(hits)
    assert reader.missing_shards == {}
    assert sorted(r["id"] for r in records if r is not None) == sorted(one + more)


def test_the_default_namenode_stays_itself_and_an_older_index_reads_it_as_before(namenodes, fake_model, tmp_path):
    """A SOURCE without a namenode (hdfs:///data) is stored so, and read again from the default namenode; an index
    an older petal wrote holds such URIs for any namenode's shards: they keep naming the default one."""
    zero = put(namenodes["nn0:8020"], "/data/shards/a.parquet", "zero", 4)
    extra = put(namenodes["nn0:8020"], "/data/more/b.parquet", "extra", 2)
    out, log = tmp_path / "out", tmp_path / "log"
    assert index(out, fake_model, log, "hdfs:///data/shards").exit_code == 0
    assert stored(out) == ["hdfs:///data/shards/a.parquet"]
    full = index(out, fake_model, log, "hdfs:///data/more", "--full")
    assert full.exit_code == 0, full.output
    assert stored(out) == ["hdfs:///data/more/b.parquet", "hdfs:///data/shards/a.parquet"]
    reader = IndexReader(out)
    hits = [row[0] for row in reader.search(reader.index.reconstruct_n(0, reader.ntotal), 1)]
    assert sorted(r["id"] for r in reader.records(hits) if r is not None) == sorted(zero + extra)
    assert reader.missing_shards == {}


def test_a_shard_an_older_petal_stored_without_its_namenode_is_never_indexed_twice(tmp_path, monkeypatch,
                                                                                  fake_model):
    """An older petal stored nn1's /data/shards/a.parquet as hdfs:///data/shards/a.parquet (as a SOURCE on the
    default namenode is stored: nn1 here). Named again as hdfs://nn1:8020/..., it is another URI: an additive run
    kept the old one as well and held every document twice. Now 78 saying what to do; --sync replaces it."""
    nn1 = tmp_path / "nn1"
    emulate_hdfs(monkeypatch, {"nn1:8020": nn1}, default="nn1:8020")
    ids = put(nn1, "/data/shards/a.parquet", "one", 4)
    put(nn1, "/data/more/b.parquet", "more", 2)
    out, log = tmp_path / "out", tmp_path / "log"
    assert index(out, fake_model, log, "hdfs:///data/shards").exit_code == 0
    as_an_older_petal_wrote(out)
    kept = index(out, fake_model, log, "hdfs://nn1:8020/data/more")  # the old record carried forward: still unknown
    assert kept.exit_code == 0, kept.output
    again = index(out, fake_model, log, "hdfs://nn1:8020/data/shards")
    assert again.exit_code == 78, again.output
    last = again.output.strip().splitlines()[-1]
    assert "hdfs://nn1:8020/data/shards/a.parquet is in the index as hdfs:///data/shards/a.parquet" in last, last
    assert "--sync" in last and "twice" in last and "id column" in last and len(indexed_ids(out)) == 6, last
    synced = index(out, fake_model, log, "hdfs://nn1:8020/data/shards", "hdfs://nn1:8020/data/more", "--sync")
    assert synced.exit_code == 0, synced.output
    assert stored(out) == ["hdfs://nn1:8020/data/more/b.parquet", "hdfs://nn1:8020/data/shards/a.parquet"]
    assert len(indexed_ids(out)) == 6 and set(ids) < set(indexed_ids(out))


def as_an_older_petal_wrote(out: Path) -> None:
    """The live manifest of ``out`` as a petal that stored every namenode's shards as hdfs:///... wrote it: its
    records without ``default_namenode`` (signed again)."""
    from petal.pipeline.layout import OutputDir
    from tests.test_open_integrity import _resigned

    def edit(manifest: dict) -> None:
        for shard in manifest["shards"]:
            shard.pop("default_namenode", None)

    _resigned(OutputDir(out).version_dir(IndexReader(out).manifest.version), edit)


def test_an_older_record_named_by_a_source_of_the_run_is_the_default_namenodes(tmp_path, monkeypatch, fake_model):
    """An older petal's hdfs:///data/shards/a.parquet, with a run naming hdfs:///data/shards (the default
    namenode's file: that record) and nn2's file of that path: two shards, never 78."""
    nodes = {name: tmp_path / name for name in ("nn0:8020", "nn2:8020")}
    emulate_hdfs(monkeypatch, nodes, default="nn0:8020")
    zero = put(nodes["nn0:8020"], "/data/shards/a.parquet", "zero", 3)
    two = put(nodes["nn2:8020"], "/data/shards/a.parquet", "two", 4)
    out, log = tmp_path / "out", tmp_path / "log"
    assert index(out, fake_model, log, "hdfs:///data/shards").exit_code == 0
    as_an_older_petal_wrote(out)
    result = index(out, fake_model, log, "hdfs:///data/shards", "hdfs://nn2:8020/data/shards")
    assert result.exit_code == 0, result.output
    assert indexed_ids(out) == sorted(zero + two)
    assert [s.default_namenode for s in IndexReader(out).manifest.shards] == [True, False]


def test_full_with_a_kept_shard_gone_names_the_namenode_not_s3s_variables(namenodes, fake_model, tmp_path):
    """Before: '... is gone (looked up through the storage's standard chain, as no SOURCE names its bucket: for S3
    AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)' for an HDFS shard."""
    put(namenodes["nn1:8020"], "/data/shards/a.parquet", "one", 4)
    put(namenodes["nn2:8020"], "/data/more/b.parquet", "two", 3)
    out, log = tmp_path / "out", tmp_path / "log"
    assert index(out, fake_model, log, "hdfs://nn1:8020/data/shards").exit_code == 0
    (namenodes["nn1:8020"] / "data/shards/a.parquet").unlink()
    gone = index(out, fake_model, log, "hdfs://nn2:8020/data/more", "--full")
    assert gone.exit_code == 78, gone.output
    last = gone.output.strip().splitlines()[-1]
    assert "hdfs://nn1:8020/data/shards/a.parquet (kept from an earlier run) is gone (looked up" in last, last
    assert "no SOURCE names its namenode" in last and "fs.defaultFS" in last and "AWS" not in last, last


def test_hdfs_without_libhdfs_or_a_jvm_is_a_short_78(fake_model, tmp_path, monkeypatch):
    """Arrow's real HadoopFileSystem on a host without a JVM: 78 was right, but its message was every dlopen Arrow
    tried (~90 lines joined by newlines, 15-30 KB), printed twice. Now what HDFS needs and the cause's first line."""
    from pyarrow import fs

    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jvm"))
    monkeypatch.setenv("ARROW_LIBHDFS_DIR", str(tmp_path / "no-libhdfs"))
    try:
        fs.FileSystem.from_uri("hdfs://127.0.0.1:1/data")
    except OSError as exc:
        if not str(exc).startswith("Unable to load lib"):
            pytest.skip(f"this host loads libhdfs and a JVM: {str(exc)[:100]}")
    else:
        pytest.skip("this host loads libhdfs and a JVM")
    result = index(tmp_path / "out", fake_model, tmp_path / "log", "hdfs://127.0.0.1:1/data/shards")
    assert result.exit_code == 78, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("petal: error: cannot open hdfs://127.0.0.1:1/data/shards: HDFS needs Hadoop's libhdfs "
                           "and a Java runtime"), last
    assert "load lib" in last and "dlopen" not in result.output, last
    assert all(name in last for name in ("JAVA_HOME", "HADOOP_HOME", "ARROW_LIBHDFS_DIR", "CLASSPATH")), last
    assert len(result.output) < 1500, len(result.output)


def test_an_index_this_petal_built_on_the_default_and_another_namenode_is_never_refused(namenodes, fake_model,
                                                                                        tmp_path):
    """Before: every hdfs:///... shard the index held was taken for an older petal's (namenode unknown): the same
    command again, --full, and adding nn2's shards to an index of the default namenode's were 78 ('an older petal
    recorded an HDFS shard without its namenode') on an index this petal built."""
    zero = put(namenodes["nn0:8020"], "/data/shards/a.parquet", "zero", 3)
    two = put(namenodes["nn2:8020"], "/data/shards/a.parquet", "two", 4)
    out, log = tmp_path / "out", tmp_path / "log"
    sources = ["hdfs:///data/shards", "hdfs://nn2:8020/data/shards"]
    for args in ([*sources], [*sources], [*sources, "--full"]):
        result = index(out, fake_model, log, *args)
        assert result.exit_code == 0, (args, result.output)
    assert stored(out) == ["hdfs:///data/shards/a.parquet", "hdfs://nn2:8020/data/shards/a.parquet"]
    assert indexed_ids(out) == sorted(zero + two)
    added = tmp_path / "added"
    assert index(added, fake_model, log, "hdfs:///data/shards").exit_code == 0
    result = index(added, fake_model, log, "hdfs://nn2:8020/data/shards")  # the kept hdfs:/// shard: this petal's
    assert result.exit_code == 0, result.output
    assert indexed_ids(added) == sorted(zero + two)
    again = index(added, fake_model, log, "hdfs://nn2:8020/data/shards", "--full")  # carried forward: still known
    assert again.exit_code == 0, again.output


def put_without_ids(root: Path, path: str, rows: int) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": [f"document {i}" for i in range(rows)], "lang": ["x"] * rows}), target)


def test_one_namenode_written_two_ways_is_78_never_its_shards_twice(tmp_path, monkeypatch, fake_model):
    """Before: hdfs://nn1/data/shards, then hdfs://nn1:8020/data/shards (one namenode: Hadoop's default port) were
    two shards at exit 0: 6 vectors for 3 documents without an id column. Whether a port left out is 8020 is
    Hadoop's configuration (Arrow passes 0), so petal asks for one spelling."""
    nn1 = tmp_path / "nn1"
    nn1.mkdir()
    emulate_hdfs(monkeypatch, {"nn1": nn1, "nn1:8020": nn1, "NN1:8020": nn1}, default="nn1:8020")
    put_without_ids(nn1, "/data/shards/a.parquet", 3)
    out, log = tmp_path / "out", tmp_path / "log"
    assert index(out, fake_model, log, "hdfs://nn1/data/shards").exit_code == 0
    for other in ("hdfs://nn1:8020/data/shards", "hdfs://NN1:8020/data/shards"):
        again = index(out, fake_model, log, other)
        assert again.exit_code == 78, again.output
        last = again.output.strip().splitlines()[-1]
        assert "the index holds hdfs://nn1/data/shards/a.parquet, which differs only in how the namenode" in last
        assert "--sync" in last, last
    assert IndexReader(out).ntotal == 3 and stored(out) == ["hdfs://nn1/data/shards/a.parquet"]
    both = index(tmp_path / "both", fake_model, log, "hdfs://nn1/data/shards", "hdfs://nn1:8020/data/shards")
    assert both.exit_code == 78 and "another SOURCE names" in both.output, both.output
    # without an id column a row's id is its shard's URI and row: --sync removes the old ones (--max-removed)
    synced = index(out, fake_model, log, "hdfs://nn1:8020/data/shards", "--sync", "--max-removed", "100%")
    assert synced.exit_code == 0, synced.output
    assert IndexReader(out).ntotal == 3 and stored(out) == ["hdfs://nn1:8020/data/shards/a.parquet"]


def test_an_hdfs_user_is_named_by_query_never_by_user_info(tmp_path, monkeypatch, fake_model):
    """Before: a refusal advised hdfs://USER@namenode:port/..., which Arrow ignores (HdfsOptions::FromUri takes the
    user from ?user= only): the run connected as the process's user without a word. Now USER@ is 78 naming
    ?user=, which reaches the namenode as that user, and the advice names ?user=."""
    from petal.pipeline.ingest.remote import storage_error

    nn1 = tmp_path / "nn1"
    connections = emulate_hdfs(monkeypatch, {"nn1:8020": nn1}, default="nn1:8020")
    put(nn1, "/data/shards/a.parquet", "one", 2)
    out, log = tmp_path / "out", tmp_path / "log"
    refused = index(out, fake_model, log, "hdfs://alice@nn1:8020/data/shards")
    assert refused.exit_code == 78, refused.output
    last = refused.output.strip().splitlines()[-1]
    assert "cannot open hdfs://nn1:8020/data/shards: an hdfs:// URI's user info (USER@) is ignored" in last, last
    assert "?user=USER" in last and connections == [], (last, connections)
    assert index(out, fake_model, log, "hdfs://nn1:8020/data/shards?user=alice").exit_code == 0
    assert set(connections) == {("nn1:8020", "alice")}, connections
    assert stored(out) == ["hdfs://nn1:8020/data/shards/a.parquet"]
    denied = str(storage_error("cannot list hdfs://nn1:8020/d", PermissionError("Permission denied: user=bob")))
    assert "?user=USER" in denied and "@" not in denied, denied


def test_a_file_named_with_a_trailing_slash_is_66(namenodes, fake_model, tmp_path):
    """Before: hdfs://nn1:8020/data/shards/a.parquet/ was 74 'storage error ...; rerun when the storage recovers'
    (Arrow refuses to list a file: 'GetFileInfo expects base_dir of selector to be a directory'), which a rerun
    never cures; a URI ending in '/' names a directory, and S3's is 66."""
    put(namenodes["nn1:8020"], "/data/shards/a.parquet", "one", 2)
    result = index(tmp_path / "out", fake_model, tmp_path / "log", "hdfs://nn1:8020/data/shards/a.parquet/")
    assert result.exit_code == 66, result.output
    last = result.output.strip().splitlines()[-1]
    assert "hdfs://nn1:8020/data/shards/a.parquet/ ends in '/' (a directory), but it names a file" in last, last
