"""A local glob SOURCE lists every directory its wildcards need, or says so; ``**`` walks each real directory once.

Before (``glob.glob``): ``petal index 'lake/*/*.parquet' --sync`` with ``lake/part=2`` unreadable exited 0 and removed
that partition's documents (a directory SOURCE said 66); ``'data/**/*.parquet'`` over two symlink loops ran without
end, its memory growing, and one loop gave each file 41 times. Real ``petal index`` processes (the fake engine),
real Parquet and FAISS; the expansion itself against Python's ``glob`` on trees without loops.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from petal.pipeline.ingest.local_glob import expand_glob
from petal.pipeline.ingest.parquet import resolve_sources
from petal.pipeline.layout import OutputDir
from petal.pipeline.reliability.errors import quote_path
from tests._perms_shared import petal
from tests.fake_engine import make_fake_model_dir
from tests.test_reliability import Job, write_shards


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def shard(path: Path, rows: int = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": [f"{path.name} row {i}" for i in range(rows)]}), path)


def no_error(directory: Path, exc: OSError) -> None:
    raise AssertionError(f"{directory}: {exc}")


def test_sync_with_a_glob_over_a_partition_petal_may_not_list_is_66_and_removes_nothing(tmp_path, fake_model):
    write_shards(tmp_path / "lake" / "part=1", names="abcdefghijkl")
    write_shards(tmp_path / "lake" / "part=2", names="z")
    job = Job(tmp_path, fake_model)
    source = f"{tmp_path}/lake/*/*.parquet"
    job.data = Path(source)
    assert job.run().rc == 0
    live = OutputDir(job.out).current_version()
    total = IndexReader(job.out).index.ntotal
    denied = tmp_path / "lake" / "part=2"
    denied.chmod(0o000)
    try:
        result = petal([*job.argv("--sync")], job.env())
    finally:
        denied.chmod(0o755)
    assert result.rc == 66, result.stderr  # was 0: 'success; 1 removed', part=2's documents gone
    said = f"glob {quote_path(source)}: a directory it lists, {quote_path(denied)}: cannot be read (Permission denied)"
    assert said in result.last_line, result.stderr
    assert OutputDir(job.out).current_version() == live
    assert IndexReader(job.out).index.ntotal == total


@pytest.mark.parametrize(("pattern", "names"), [("loops/**/*.parquet", "xy"), ("loops/**", "xy"),
                                               ("loops/a/**/*.parquet", "xy"), ("loops/*/*/*.parquet", "y")])
def test_a_glob_through_symlink_loops_ends_naming_each_file_once(tmp_path, pattern, names):
    """Two loop links made ``**`` walk without end: the expansion runs in a child, so a loop cannot hang the run."""
    files = {"x": tmp_path / "loops" / "a" / "x.parquet", "y": tmp_path / "loops" / "a" / "b" / "y.parquet"}
    for path in files.values():
        shard(path)
    (tmp_path / "loops" / "a" / "b" / "up").symlink_to("..")
    (tmp_path / "loops" / "a" / "b" / "up2").symlink_to("../..")
    code = ("import sys; from petal.pipeline.ingest.parquet import resolve_sources; "
            "print('\\n'.join(str(p.resolve()) for p in resolve_sources([sys.argv[1]])))")
    done = subprocess.run([sys.executable, "-c", code, pattern], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == sorted(str(files[n]) for n in names)


TREE = ["d/a.parquet", "d/b.PARQUET", "d/.h.parquet", "d/_t/c.parquet", "d/s/e.parquet", "d/s/t/f.parquet",
        "d/.hid/g.parquet", "d/x[1].parquet", "d/s/README.txt", "top.parquet"]
PATTERNS = ["d/*.parquet", "d/*", "d/**", "d/**/*.parquet", "**/*.parquet", "d/**/t/*.parquet", "d/.*", "d/.*/*",
            "d/s/*/*.parquet", "d/?.parquet", "d/[ab].*", "d/x[[]1].parquet", "*", "d/**/**/*.parquet",
            "d/*/", "nothere/*", "d/s/**/e.parquet", "d/_*/*.parquet", "**"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_expansion_names_what_python_glob_names_on_a_tree_without_loops(tmp_path, monkeypatch, pattern):
    for name in TREE:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    want = {os.path.normpath(p) for p in python_glob(pattern)}
    assert {os.path.normpath(p) for p in expand_glob(pattern, no_error)} - {"."} == want - {"."}


def python_glob(pattern: str, root: str = "") -> list[str]:
    """``glob.glob``'s matches, less those a wildcard finds through a name starting with ``_`` below ``root``
    (``d/_t/``), which petal's glob skips as it skips those starting with ``.``; a pattern that writes ``_`` there
    names them (``d/_*/``)."""
    found = glob.glob(pattern, recursive=True)
    if "_" in pattern[len(root):]:
        return found
    return [p for p in found if not any(n.startswith("_") for n in Path(p[len(root):]).parts)]


def test_a_glob_of_absolute_paths_expands_as_python_glob_does(tmp_path):
    for name in TREE:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    pattern = f"{tmp_path}/d/**/*.parquet"
    assert expand_glob(pattern, no_error) == sorted(os.path.normpath(p) for p in python_glob(pattern, str(tmp_path)))


def test_resolve_sources_reads_a_glob_through_one_loop_once(tmp_path):
    shard(tmp_path / "one" / "a" / "x.parquet")
    (tmp_path / "one" / "a" / "up").symlink_to("..")
    found = resolve_sources([f"{tmp_path}/one/**/*.parquet"])
    assert [p.resolve() for p in found] == [tmp_path / "one" / "a" / "x.parquet"]  # was 41 spellings of it
