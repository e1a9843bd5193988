"""``petal bench index --workdir W`` removes only what its run wrote. Before, it removed ``W/d<DIM>`` whole after
each dimension's run, whatever that directory held before. A real ``petal`` process, the smallest scenario."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


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
    assert left == ["d8", "d8/mine.txt", "d8/nested", "d8/nested/also-mine.bin", "other"], left
    assert (work / "d8" / "mine.txt").read_text() == "a user's file"
