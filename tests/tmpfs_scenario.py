"""A real full disk, run by tests/test_reliability.py inside a mount namespace with OUT on a small tmpfs.

``python tests/tmpfs_scenario.py DATA OUT MODEL RESULT.json [DATA2 MOUNT2 RESULT2.json]``: index a small shard
(fits); add a shard whose store entry cannot fit (fails in the store); swap it for one whose entry fits but whose
index cannot (fails writing the index); drop it and rerun with ``--keep-unused 0`` (succeeds, cleans up). Writes
one JSON record per run to RESULT.json. With MOUNT2, a tmpfs with few inodes: ``no_inodes``, a disk full of files
rather than of bytes.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def shard(path: Path, name: str, rows: int) -> None:
    pq.write_table(pa.table({"id": [f"{name}-{i}" for i in range(rows)],
                             "text": [f"{name} document number {i}" for i in range(rows)]}), path)


def main(data: Path, out: Path, model: Path, result_path: Path) -> None:
    from petal.pipeline.layout import OutputDir
    from tests import forkrun
    from tests.invariants import assert_clean, live, tree_digest

    steps = []

    def run(*extra: str) -> None:
        layout = OutputDir(out)
        before = layout.current_version() if out.exists() else None
        digest = tree_digest(layout.versions_dir / before) if before else None
        report = out.parent / "report.json"
        result = forkrun.petal(["index", str(data), "--out", str(out), "--model", str(model), "-q",
                                "--json-report", str(report), *extra],
                               {"PETAL_TEST_FAKE_ENGINE": str(out.parent / "log")})
        message = (result.report or {}).get("message", "")
        intact = before is not None and layout.current_version() == before \
            and tree_digest(layout.versions_dir / before) == digest
        if intact:
            live(out)
        clean = True
        if result.rc == 0:
            try:
                assert_clean(out)
            except AssertionError:
                clean = False
        leftovers = [p.name for p in (out / "store" / "tmp").iterdir()] + \
            [p.name for p in layout.versions_dir.iterdir() if p.name != layout.current_version()]
        steps.append({"rc": result.rc, "leftovers": leftovers, "status": (result.report or {}).get("status"),
                      "last_line": result.last_line,
                      "live_intact": intact, "clean": clean,
                      "failed_in": "store" if "/store/" in message else "index" if "/versions/" in message else ""})

    run()  # a small index fits
    shard(data / "b.parquet", "b", 14_000)  # its store entry alone needs 1.8 MB
    run()
    (data / "b.parquet").unlink()
    shard(data / "c.parquet", "c", 6_000)  # 0.8 MB in the store fits; the index needs as much again
    run()
    (data / "c.parquet").unlink()
    run("--keep-unused", "0")  # NOTE: else c's entry, which no version uses, stays for a rerun (a week by default)
    result_path.write_text(json.dumps(steps, indent=1))


def no_inodes(data: Path, mount: Path, model: Path, result_path: Path) -> None:
    """OUT on ``mount``: index DATA, take every inode left, then a run with a changed shard and one to a new OUT
    there (both must fail as a full disk), then free the inodes and rerun. Writes each run's exit status and last
    line, and whether the live version stayed intact, to RESULT.json."""
    from petal.pipeline.layout import OutputDir
    from tests import forkrun
    from tests.invariants import assert_clean, live, tree_digest

    out = mount / "out"
    steps: dict[str, object] = {}

    def run(name: str, target: Path) -> None:
        result = forkrun.petal(["index", str(data), "--out", str(target), "--model", str(model), "-q"],
                               {"PETAL_TEST_FAKE_ENGINE": str(data.parent / "log")})
        steps[name] = {"rc": result.rc, "last_line": result.last_line}

    shard(data / "a.parquet", "a", 8)
    run("first", out)
    version = OutputDir(out).current_version()
    digest = tree_digest(out / "versions" / str(version))
    filler = mount / "filler"
    filler.mkdir()
    try:
        for i in range(100_000):
            (filler / str(i)).touch()
    except OSError as exc:
        assert exc.errno == 28, exc  # ENOSPC: no inode left
    shard(data / "b.parquet", "b", 8)
    run("changed", out)
    run("new_out", mount / "new")
    steps["intact"] = OutputDir(out).current_version() == version and tree_digest(out / "versions" / str(version)) \
        == digest
    live(out)
    shutil.rmtree(filler)
    run("freed", out)
    assert_clean(out)
    result_path.write_text(json.dumps(steps))


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:5]))
    if len(sys.argv) > 5:
        no_inodes(*(Path(a) for a in (*sys.argv[5:7], sys.argv[3], sys.argv[7])))
