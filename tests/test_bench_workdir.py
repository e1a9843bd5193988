"""``petal bench index --workdir W`` removes only what its run wrote. Before, it removed ``W/d<DIM>`` whole after
each dimension's run, whatever that directory held before. A real ``petal`` process, the smallest scenario."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_bench_leftovers import said


def test_bench_index_keeps_what_the_workdir_held(tmp_path: Path):
    work = tmp_path / "work"
    (work / "d8" / "nested").mkdir(parents=True)
    (work / "d8" / "mine.txt").write_text("a user's file")
    (work / "d8" / "nested" / "also-mine.bin").write_bytes(b"\0" * 10)
    (work / "other").mkdir()
    proc = subprocess.run([sys.executable, "-m", "petal.cli.main", "bench", "index", "--workdir", str(work),
                           "--vectors", "1000", "--dim", "8", "--dim", "16", "--queries", "10", "--no-baseline",
                           "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout.strip().splitlines()) == 2  # both dimensions ran
    # what was there is kept; what the runs wrote (a store under d8, d16 made for the run) is gone
    left = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
    assert left == [".petal-bench.lock", "d8", "d8/mine.txt", "d8/nested", "d8/nested/also-mine.bin", "other"], left
    assert (work / "d8" / "mine.txt").read_text() == "a user's file"


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root``: (size, mtime_ns) of what it holds."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_bench_serve_refuses_a_users_index_in_its_workdir_and_leaves_it(tmp_path: Path):
    """``bench serve --workdir W`` with W/out a user's own index (built by ``petal index``, no bench record): it said
    'built for other settings; building it again' and removed it (rmtree). Now 73 naming it, before a model is made
    or anything written, the index as it was."""
    from tests.test_bench_early_checks import refused

    work = tmp_path / "work"
    shard = REPO / "sample_data" / "shard-000.parquet"
    built = subprocess.run([sys.executable, "-m", "petal.cli.main", "index", str(shard), "--out", str(work / "out"),
                            "-q", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    before = _tree(work)
    refused(tmp_path, 73, f"{work / 'out'} was not written by petal bench; give another --workdir or remove it",
            "serve", "--workdir", work, "--endpoints", "search", "--corpus", REPO / "sample_data")
    assert _tree(work) == before


@pytest.mark.parametrize("place", ["docs/part-0000.parquet", "serve.log", "model-minilm/config.json"])
def test_bench_serve_refuses_a_users_file_where_it_writes(tmp_path: Path, place: str):
    """A user's file named like the bench's document shard (it unlinked every docs/part-*.parquet), its log (it
    truncated serve.log) or its model directory: 73 naming it, untouched."""
    from tests.test_bench_early_checks import refused

    work = tmp_path / "work"
    (work / place).parent.mkdir(parents=True)
    (work / place).write_text("a user's file")
    top = work / place.split("/")[0]
    refused(tmp_path, 73, f"{top} was not written by petal bench", "serve", "--workdir", work, "--shape", "minilm",
            "--index-docs", 100, "--corpus", REPO / "sample_data")
    assert (work / place).read_text() == "a user's file"
    nothing_else = [place.split("/")[0], place] if "/" in place else [place]
    assert sorted(str(p.relative_to(work)) for p in work.rglob("*")) == nothing_else


@pytest.mark.parametrize("place", ["index-1000x8-auto/out/CURRENT", "index-1000x8-auto/notes.txt",
                                   "model-minilm/config.json", "query.npy"])
def test_bench_startup_refuses_what_it_did_not_write_in_its_workdir(tmp_path: Path, place: str):
    """``bench startup --workdir W``: a user's index where it builds one (it removed it when its size differed),
    their model directory or query file: 73 naming it, before its timed runs, untouched."""
    from tests.test_bench_early_checks import refused

    work = tmp_path / "work"
    (work / place).parent.mkdir(parents=True)
    (work / place).write_text("a user's file")
    top = work / place.split("/")[0]
    refused(tmp_path, 73, f"{top} was not written by petal bench", "startup", "--workdir", work, "--runs", 1,
            "--vectors", 1000, "--dim", 8, "--no-baseline", "--device", "cpu")
    assert (work / place).read_text() == "a user's file"


def test_a_second_bench_on_a_workdir_in_use_is_refused_75_naming_the_holder(tmp_path: Path):
    """Two ``bench serve --workdir W`` at once: the second rebuilt the index the first was serving and truncated its
    server's log, both exiting 0. Now every bench command that writes a --workdir holds its lock: a second one is 75
    naming the holder (its pid), before anything is made or written; the first runs on."""
    import time

    from tests.test_bench_early_checks import refused

    work = tmp_path / "work"
    first = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "bench", "serve", "--workdir", str(work),
                              "--endpoints", "embeddings", "--tokens", "16", "--concurrency", "1", "--requests",
                              "1000000", "--seconds", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not (work / "serve.log").is_file() or "listening on" not in (work / "serve.log").read_text():
            assert first.poll() is None and time.monotonic() < deadline, said(first)
            time.sleep(0.2)
        log = (work / "serve.log").read_text()
        held = f"is in use by another petal bench ({{\"pid\": {first.pid}"
        refused(tmp_path, 75, held, "serve", "--workdir", work, "--endpoints", "embeddings", "--tokens", 16,
                "--concurrency", 1, "--requests", 3, "--seconds", 1)
        refused(tmp_path, 75, held, "startup", "--workdir", work, "--runs", 1, "--vectors", 1000, "--dim", 8,
                "--no-baseline", "--device", "cpu")
        refused(tmp_path, 75, held, "index", "--workdir", work, "--vectors", 1000, "--dim", 8, "--queries", 10,
                "--no-baseline")
        assert (work / "serve.log").read_text() == log  # the first server's log, not truncated
        assert sorted(p.name for p in work.iterdir()) == [".petal-bench.json", ".petal-bench.lock", "serve.log"]
        assert first.poll() is None
    finally:
        first.terminate()
        first.communicate(timeout=120)
