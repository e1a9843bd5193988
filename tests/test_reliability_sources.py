"""What `petal index` reads as input and how it detects change (issue 12 items 2, 3, 5, 6, 7, 10, 11, 17):
OUT inside a SOURCE directory, symlinked subdirectories, non-regular files, content changes that keep
size and mtime, page checksums, duplicate ids across shards, uint64 ids, file names that are not UTF-8
or hold a newline. In-process CLI (CliRunner), real Parquet, the fake engine."""

from __future__ import annotations

import glob as globlib
import json
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from tests.fake_cli import invoke
from tests.fake_engine import embedded_ids, make_fake_model_dir

ROWS = 6


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def index(tmp_path, fake_model):
    """``index(*sources, out=..., flags...)`` -> (exit code, stderr, report or None, embedded ids)."""
    def run(*args: str | Path, out: Path | None = None, command: str = "index"):
        out = out or tmp_path / "out"
        report, log = tmp_path / "report.json", tmp_path / "fake.jsonl"
        report.unlink(missing_ok=True)
        log.unlink(missing_ok=True)
        argv = [command, *map(str, args), "--out", str(out), "--model", str(fake_model), "-q",
                "--json-report", str(report)]
        result = invoke(argv, env={"PETAL_TEST_FAKE_ENGINE": str(log)})
        assert result.exit_code not in (1, 2), result.output  # never a bug, never a "usage error" from data
        assert "Traceback" not in result.output
        data = json.loads(report.read_text()) if report.exists() else None
        return result.exit_code, result.stderr, data, embedded_ids(log)

    return run


def shard(path: Path, name: str, rows: int = ROWS, ids: list | None = None, **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids if ids is not None else [f"{name}-{i}" for i in range(rows)],
                             "text": [f"{name} says {i:03d}" for i in range(rows)]}), path, **kwargs)
    return path


# --- item 2: --out inside an input directory ------------------------------------------------------

@pytest.mark.parametrize("layout", ["out in data", "out nested deeper", "glob over data"])
def test_out_inside_a_source_directory_is_never_read_as_input(index, tmp_path, layout):
    data = tmp_path / "data"
    shard(data / "a.parquet", "a")
    shard(data / "sub" / "b.parquet", "b")
    out = data / "idx" if layout != "out nested deeper" else data / "sub" / "deep" / "idx"
    source = str(data) if layout != "glob over data" else f"{data}/**/*.parquet"
    for attempt in range(3):  # a cron job: the first success must not make every later run fail
        code, err, report, embedded = index(source, out=out)
        assert code == 0, err
        assert report["shards"]["total"] == 2 and len(embedded) == (2 * ROWS if attempt == 0 else 0)
    assert report["status"] == "nothing-to-do"


def test_other_petal_output_directories_inside_a_source_are_skipped(index, tmp_path):
    data = tmp_path / "data"
    shard(data / "a.parquet", "a")
    assert index(data / "a.parquet", out=data / "old-index")[0] == 0  # an index somewhere inside data
    code, err, report, _ = index(data, out=tmp_path / "out")
    assert code == 0 and report["shards"]["total"] == 1, err


def test_a_file_named_inside_out_is_refused(index, tmp_path):
    data = tmp_path / "data"
    shard(data / "a.parquet", "a")
    out = tmp_path / "out"
    assert index(data, out=out)[0] == 0
    inside = sorted(out.glob("versions/*/ids.parquet"))[0]
    code, err, _, embedded = index(inside, out=out)
    assert code == 65 and "inside the output directory" in err and embedded == []


# --- item 5: symlinked subdirectories, non-regular files -------------------------------------------

def test_symlinked_subdirectories_are_followed_once_even_in_a_loop(index, tmp_path):
    real = tmp_path / "elsewhere"
    shard(real / "b.parquet", "b")
    data = tmp_path / "data"
    shard(data / "a.parquet", "a")
    (data / "linked").symlink_to(real, target_is_directory=True)
    (data / "loop").symlink_to(data, target_is_directory=True)
    (real / "back").symlink_to(data, target_is_directory=True)
    code, err, report, _ = index(data)
    assert code == 0, err
    assert report["shards"]["total"] == 2 and report["rows"]["embedded"] == 2 * ROWS


@pytest.mark.parametrize("kind", ["dangling symlink", "fifo"])
def test_a_parquet_name_that_is_not_a_regular_file_is_refused_not_skipped(index, tmp_path, kind):
    data = tmp_path / "data"
    shard(data / "a.parquet", "a")
    odd = data / "z.parquet"
    if kind == "fifo":
        os.mkfifo(odd)
    else:
        odd.symlink_to(tmp_path / "gone.parquet")
    for source in (data, odd):
        code, err, _, embedded = index(source)
        assert code == 65 and "z.parquet" in err and embedded == []


# --- item 3: content changes that keep size and mtime ---------------------------------------------

def _same_size_change(path: Path, how: str, tmp_path: Path) -> None:
    before = path.stat()
    texts = [f"a SAYS {i:03d}" for i in range(ROWS)]  # same lengths, other content
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"id": [f"a-{i}" for i in range(ROWS)], "text": texts}), other,
                   compression="none", write_statistics=False)
    assert other.stat().st_size == before.st_size
    if how == "cp -p":
        os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
        shutil.copy2(other, path)
    elif how == "rewrite in place, mtime restored":
        path.write_bytes(other.read_bytes())
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    else:  # tar extraction: a new file with the archived mtime
        path.unlink()
        shutil.copyfile(other, path)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


@pytest.mark.parametrize("how", ["cp -p", "rewrite in place, mtime restored", "tar extraction"])
@pytest.mark.parametrize("settle", [False, True], ids=["at once", "after the file settled"])
def test_a_change_that_keeps_size_and_mtime_is_embedded_again(index, tmp_path, how, settle):
    data = tmp_path / "data"
    a = shard(data / "a.parquet", "a", compression="none", write_statistics=False)
    shard(data / "b.parquet", "b")
    if settle:  # hashed long after its last change: the cached hash is trusted unless the inode changed
        time.sleep(2.2)
    assert index(data)[0] == 0
    unchanged = index(data)
    assert unchanged[2]["status"] == "nothing-to-do" and unchanged[3] == []
    _same_size_change(a, how, tmp_path)
    code, err, report, embedded = index(data)
    assert code == 0 and report["shard_changes"]["changed"] == [str(a)], err
    assert sorted(embedded) == [f"a-{i}" for i in range(ROWS)]
    hits = IndexReader(tmp_path / "out").ids
    assert hits.num_rows == 2 * ROWS


# --- item 6: page checksums -------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["text page", "id page"])
def test_a_corrupt_page_with_a_checksum_is_refused(index, tmp_path, where):
    path = tmp_path / "data" / "a.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"id": [f"id-{i:05d}" for i in range(400)],
                             "text": [f"text {i} " * 8 for i in range(400)]}), path,
                   compression="none", use_dictionary=False, write_page_checksum=True)
    column = pq.read_metadata(path).row_group(0).column(1 if where == "text page" else 0)
    data = bytearray(path.read_bytes())
    spot = column.data_page_offset + column.total_compressed_size // 2  # inside the values, past the header
    data[spot] ^= 0x01  # a one-character change: still decodes, the CRC no longer matches
    path.write_bytes(bytes(data))
    code, err, _, embedded = index(path)
    assert code == 65 and "a.parquet" in err and embedded == []


# --- item 7: duplicate ids across shards ------------------------------------------------------------

def test_duplicate_ids_across_shards_last_path_wins_counted_and_strict_refuses(index, tmp_path):
    data = tmp_path / "data"
    shard(data / "a.parquet", "a", ids=[f"x-{i}" for i in range(ROWS)])
    shard(data / "b.parquet", "b", ids=[f"x-{i}" for i in range(2)] + [f"b-{i}" for i in range(ROWS - 2)])
    code, err, report, _ = index(data)
    assert code == 0 and report["index"]["superseded"] == 2 and "2 superseded" in err.strip().splitlines()[-1]
    assert err.strip().splitlines()[-1].count("superseded") == 1  # said once (was twice)
    reader = IndexReader(tmp_path / "out")
    owners = {doc: shard_path for doc, shard_path in zip(reader.ids.column("id").to_pylist(),
                                                           reader.ids.column("shard").to_pylist())}
    assert owners["x-0"].endswith("b.parquet") and owners["x-5"].endswith("a.parquet")  # the later path wins
    code, err, report, embedded = index(data, "--strict", out=tmp_path / "strict")
    last = err.strip().splitlines()[-1]
    assert code == 65 and "x-0" in last and "a.parquet" in last and "b.parquet" in last
    assert embedded == []  # refused before any model work


def test_integer_ids_duplicated_across_shards_under_strict(index, tmp_path):
    data = tmp_path / "data"
    shard(data / "a.parquet", "a", ids=list(range(ROWS)))
    shard(data / "b.parquet", "b", ids=list(range(ROWS - 1, 2 * ROWS - 1)))
    code, err, _, _ = index(data, "--strict")
    assert code == 65 and f"id \"{ROWS - 1}\"" in err


# --- item 10: ids that do not fit int64 -------------------------------------------------------------

@pytest.mark.parametrize("statistics", [True, False])
def test_uint64_ids_above_int64_fail_in_preflight_naming_file_column_and_row(index, tmp_path, statistics):
    path = tmp_path / "data" / "u.parquet"
    path.parent.mkdir()
    ids = pa.array([1, 2, 2**63 + 5, 7], pa.uint64())
    pq.write_table(pa.table({"id": ids, "text": ["a", "b", "c", "d"]}), path, write_statistics=statistics)
    code, err, report, embedded = index(path)
    assert code == 65 and "u.parquet" in err and "'id'" in err and "row 2" in err
    assert embedded == [] and report["status"] == "failed"
    fine = tmp_path / "data2" / "v.parquet"
    fine.parent.mkdir()
    pq.write_table(pa.table({"id": pa.array([1, 2**63 - 1], pa.uint64()), "text": ["a", "b"]}), fine)
    assert index(fine, out=tmp_path / "out2")[0] == 0


# --- items 11, 17: file names that are not UTF-8, or hold a newline ---------------------------------

def test_a_file_name_that_is_not_utf8_is_65_naming_it(index, tmp_path):
    data = tmp_path / "data"
    shard(data / "a.parquet", "a")
    bad = os.path.join(os.fsencode(data), b"caf\xe9.parquet")
    shutil.copyfile(data / "a.parquet", bad)
    code, err, _, embedded = index(data)
    assert code == 65 and "caf\\xe9.parquet" in err and embedded == []


FORGED = "petal index: success; 1 shards (1 embedded, 0 reused)"


@pytest.mark.parametrize("where", ["corrupt shard", "bad column", "missing source"])
def test_a_newline_in_a_file_name_cannot_forge_a_line(index, tmp_path, where):
    data = tmp_path / "data"
    data.mkdir()
    name = data / f"x\n{FORGED}\n.parquet"
    if where == "corrupt shard":
        name.write_bytes(b"not parquet at all")
    elif where == "bad column":
        pq.write_table(pa.table({"id": [1], "body": ["x"]}), name)
    code, err, report, _ = index(name if where == "missing source" else data)
    assert code in (65, 66)
    lines = err.strip().splitlines()
    assert not any(line.startswith(FORGED) for line in lines), err
    summary = [line for line in lines if line.startswith("petal index: ")]
    assert len(summary) == 1 and summary[0].startswith("petal index: failed") and "\\n" in summary[0]
    assert lines[-1].startswith("petal: error: ") and "\\n" in lines[-1]
    assert report["message"].count("\n") == 0


def test_sources_found_in_sorted_order_are_the_glob_order(tmp_path):
    """Duplicate resolution and shard order rest on the sorted absolute path (README)."""
    from petal.pipeline.ingest.parquet import resolve_sources

    for name in ("b", "a", "c"):
        shard(tmp_path / f"{name}.parquet", name)
    assert [p.name for p in resolve_sources([str(tmp_path)])] == sorted(Path(p).name for p in
                                                                        globlib.glob(f"{tmp_path}/*.parquet"))
