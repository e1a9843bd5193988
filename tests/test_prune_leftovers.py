"""What pruning and the clean-up cannot delete is said, listed in the report's ``pruned.left`` and left on disk, and
every later run tries again (and says so again while it fails); it is never reported as pruned.

Before: ``shutil.rmtree(..., ignore_errors=True)``. A version petal could not delete (a directory of it it may not
write) was listed in ``pruned.versions``, at exit 0 without a word, and stayed as ``versions/.deleting-<id>`` with its
files for good (each later clean-up failed silently again); a store entry that could not be moved out ended the whole
clean-up with 'cleaning up OUT failed (Permission denied)', naming nothing; a leftover under ``store/tmp/`` that could
not be removed failed every later run (73 'petal may not write f').

Real ``petal`` processes (forked from a preloaded interpreter, without the capabilities that bypass file modes when
run as root: tests/_perms_shared.py), real Parquet and FAISS, a ``--vectors-column`` index.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import _perms_shared as perms
from tests.forkrun import Result

DIM = 8


def write_vectors(path: Path, seed: int) -> None:
    flat = np.random.default_rng(seed).standard_normal((40, DIM)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": np.arange(40) + 1000 * seed,
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}), path)


def petal(*argv: object) -> Result:
    return perms.petal([str(a) for a in argv])


def index(source: Path, out: Path, report: Path, *extra: object) -> Result:
    return petal("index", source, "--out", out, "-q", "--vectors-column", "emb", "--index-factory", "Flat",
                 "--json-report", report, *extra)


def versions(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "versions").iterdir() if not p.name.startswith("."))


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OUT with 4 versions (kept with --keep-versions 10), each built from another edition of data/a.parquet (the
    last one stays: the store records its path)."""
    root = tmp_path_factory.mktemp("prune-leftovers")
    (root / "data").mkdir()
    for seed in range(4):
        write_vectors(root / "data" / "a.parquet", seed)
        run = index(root / "data" / "a.parquet", root / "out", root / "r.json", "--keep-versions", 10)
        assert run.rc == 0, run.stderr[-3000:]
    assert len(versions(root / "out")) == 4
    return root / "out"


@pytest.fixture
def out(four: Path, tmp_path: Path):
    copy = tmp_path / "out"
    shutil.copytree(four, copy)
    yield copy
    for path in [copy, *copy.rglob("*")]:  # what a test made read-only, for pytest to remove
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)


def left_paths(result: Result) -> list[str]:
    assert result.report is not None, result.stderr
    return [entry["path"] for entry in result.report["pruned"]["left"]]


@pytest.mark.parametrize("command", ["rebuild", "index"])
def test_a_version_pruning_cannot_delete_is_said_left_and_tried_again(out, tmp_path, command):
    v1, v2, v3, v4 = versions(out)
    (out / "versions" / v1).chmod(0o555)  # its files cannot be unlinked
    write_vectors(tmp_path / "b.parquet", 9)
    report = tmp_path / "r.json"

    def run(keep: int) -> Result:
        if command == "rebuild":
            return petal("rebuild", out, "--keep-versions", keep, "--json-report", report)
        return index(tmp_path / "b.parquet", out, report, "--keep-versions", keep)  # additive: a publish each time

    first = run(1)
    assert first.rc == 0, first.stderr
    trash = out / "versions" / f".deleting-{v1}"
    assert trash.is_dir() and (trash / "manifest.json").is_file()
    assert first.report is not None and first.report["pruned"]["versions"] == [v2, v3, v4], first.report["pruned"]
    assert left_paths(first) == [str(trash)]
    assert "Permission denied" in first.report["pruned"]["left"][0]["reason"]
    assert f"warning: could not remove {trash} (the version {v1}, which --keep-versions 1 prunes" in first.stderr
    assert f"note: removed 3 old versions (--keep-versions 1): {v2}, {v3}, {v4}" in first.stderr, first.stderr

    write_vectors(tmp_path / "b.parquet", 10)
    again = run(2)  # the next run's clean-up tries again, and says so again
    assert again.rc == 0, again.stderr
    assert trash.is_dir() and left_paths(again) == [str(trash)]
    assert f"warning: could not remove {trash} (what is left of the deleted version {v1}" in again.stderr
    assert v1 not in again.report["pruned"]["versions"]

    trash.chmod(0o755)
    write_vectors(tmp_path / "b.parquet", 11)
    fixed = run(2)
    assert fixed.rc == 0 and not trash.exists(), fixed.stderr
    assert left_paths(fixed) == [] and "could not remove" not in fixed.stderr


def _entry_of(out: Path, version: str) -> Path:
    (shard,) = json.loads((out / "versions" / version / "manifest.json").read_text())["shards"]
    (entry,) = (out / "store" / "shards").glob(f"*/{shard['entry']}")
    return entry


def test_a_store_entry_that_cannot_be_moved_out_is_said_and_the_rest_is_pruned(out, tmp_path):
    v1 = versions(out)[0]
    entry = _entry_of(out, v1)
    entry.chmod(0o555)  # a directory renamed to another parent must be writable (its '..')
    write_vectors(tmp_path / "b.parquet", 9)
    run = index(tmp_path / "b.parquet", out, tmp_path / "r.json", "--keep-versions", 1)
    assert run.rc == 0, run.stderr
    assert run.report is not None and len(versions(out)) == 1
    assert (entry / "entry.json").is_file() and left_paths(run) == [str(entry)], run.report["pruned"]
    assert run.report["pruned"]["store_entries"] == 2, run.report["pruned"]  # v2's and v3's; v4's a is kept
    assert f"warning: could not remove {entry} (a store entry no version uses" in run.stderr, run.stderr
    assert "cleaning up" not in run.stderr

    entry.chmod(0o755)
    write_vectors(tmp_path / "b.parquet", 10)
    fixed = index(tmp_path / "b.parquet", out, tmp_path / "r.json", "--keep-versions", 1)
    assert fixed.rc == 0 and not entry.exists() and left_paths(fixed) == [], fixed.stderr


def test_a_store_tmp_leftover_that_cannot_be_removed_is_said_not_fatal(out, tmp_path):
    stuck = out / "store" / "tmp" / "discard-0123456789ab"
    stuck.mkdir(parents=True)
    (stuck / "embeddings.npy").write_bytes(b"x")
    stuck.chmod(0o555)
    source = Path(json.loads((out / "versions" / versions(out)[-1] / "manifest.json").read_text())["shards"][0]
                  ["abs_path"])
    run = index(source, out, tmp_path / "r.json")
    assert run.rc == 0, run.stderr  # was 73: 'cannot create output: petal may not write embeddings.npy'
    assert run.report is not None and run.report["status"] == "nothing-to-do"
    assert left_paths(run) == [str(stuck)] and f"warning: could not remove {stuck}" in run.stderr
    stuck.chmod(0o755)
    again = index(source, out, tmp_path / "r.json")
    assert again.rc == 0 and not stuck.exists() and left_paths(again) == [], again.stderr


def test_a_staging_leftover_that_cannot_be_removed_is_said(out, tmp_path):
    staging = out / "versions" / ".staging-0123456789ab"
    staging.mkdir()
    (staging / "index.faiss").write_bytes(b"x")
    staging.chmod(0o555)
    write_vectors(tmp_path / "b.parquet", 9)
    run = index(tmp_path / "b.parquet", out, tmp_path / "r.json", "--keep-versions", 10)
    assert run.rc == 0, run.stderr
    assert left_paths(run) == [str(staging)] and staging.is_dir()
    assert f"warning: could not remove {staging} (the staging directory of a run that stopped or failed" in run.stderr
