"""``petal index`` over a store petal may not read: a store entry (or a directory on the way to it) of mode 000 is no
input, 66 naming it, as ``petal rebuild`` does (tests/test_rebuild_unreadable_store.py): nothing is wrong with it, so
it is neither re-embedded nor removed, and the live version stays. A damaged entry (a truncated file) is still
embedded again. OUT/store itself unreadable or unwritable is named, never a source shard.

Before: the entry was taken for damaged ("the store entry ... is damaged (Permission denied); embedding the shard
again"), moved out of the store and embedded again; a shard key directory petal may not list was reported as the
source shard petal may not read.

Real ``petal index`` processes (the tests' fake engine; forked from a preloaded interpreter, tests/_perms_shared.py),
without the capabilities that bypass file modes when run as root, real Parquet, FAISS and store.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir
from tests import _perms_shared as perms
from tests.fake_engine import make_fake_model_dir

FAKE: dict[str, Path] = {}


@pytest.fixture(scope="module", autouse=True)
def fake_model(tmp_path_factory) -> None:
    FAKE["model"] = make_fake_model_dir(tmp_path_factory.mktemp("model"))


def petal(argv: list[str], unprivileged: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``petal ARGV --model FAKE`` with the tests' fake engine in its own process (forked from a preloaded
    interpreter: tests/_perms_shared.py); ``unprivileged``: for root, without the capabilities that bypass file
    permissions, so a file's mode can deny a read."""
    argv = [*argv, "--model", str(FAKE["model"])]
    fake = {"PETAL_TEST_FAKE_ENGINE": str(FAKE["model"].parent / "fake.jsonl")}
    run = perms.petal(argv, env={**fake, **(env or {})}, unprivileged=unprivileged, timeout=600)
    return subprocess.CompletedProcess(["petal", *argv], run.rc, run.stdout, run.stderr)


TEXTS = ["glaciers flow downhill under their own weight", "a recipe for sourdough bread",
         "the tides follow the moon", "volcanoes erupt molten rock"]


def write_shard(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [f"{path.stem}-{i}" for i in range(len(TEXTS))],
                             "text": [f"{path.stem}: {text}" for text in TEXTS]}), path)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """OUT with one version from shard a. Returns (a.parquet, OUT); a test copies OUT (a stays where the store's
    records name it) and adds a shard b of its own, so that its run has a version to publish."""
    root = tmp_path_factory.mktemp("store-denied")
    write_shard(root / "data" / "a.parquet")
    run = petal(["index", str(root / "data" / "a.parquet"), "--out", str(root / "out"), "-q"], unprivileged=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return root / "data" / "a.parquet", root / "out"


def entry_of_a(out: Path) -> Path:
    (entry,) = (out / "store" / "shards").glob("*/*")
    return entry


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


KINDS = ["entry.json", "embeddings.npy", "rows.parquet", "rejects.parquet", "entry dir", "shard key dir"]


def target_of(out: Path, kind: str) -> Path:
    entry = entry_of_a(out)
    return {"entry dir": entry, "shard key dir": entry.parent}.get(kind, entry / kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_store_entry_petal_may_not_read_is_66_naming_it_and_is_kept(built, tmp_path, kind):
    a, built_out = built
    out = tmp_path / "out"
    shutil.copytree(built_out, out)
    live = OutputDir(out).current_version()
    entry = entry_of_a(out)
    before = snapshot(entry)
    write_shard(tmp_path / "b.parquet")
    target = target_of(out, kind)
    mode = target.stat().st_mode & 0o777
    target.chmod(0)
    try:
        proc = petal(["index", str(a), str(tmp_path / "b.parquet"), "--out", str(out), "-q"])
    finally:
        target.chmod(mode)
    assert proc.returncode == 66, (kind, proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert str(target) in last and "petal may not read it (permission denied)" in last, last
    assert "damaged" not in proc.stderr and "a.parquet" not in last, proc.stderr
    assert OutputDir(out).current_version() == live and OutputDir(out).versions() == [live]
    assert snapshot(entry) == before  # neither moved out of the store nor written again


def test_a_damaged_store_entry_is_still_embedded_again(built, tmp_path):
    a, built_out = built
    out = tmp_path / "out"
    shutil.copytree(built_out, out)
    live = OutputDir(out).current_version()
    npy = entry_of_a(out) / "embeddings.npy"
    whole = npy.read_bytes()
    npy.write_bytes(whole[:-16])
    proc = petal(["index", str(a), "--out", str(out), "-q"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "is damaged" in proc.stderr and "embedding the shard again" in proc.stderr, proc.stderr
    assert (entry_of_a(out) / "embeddings.npy").read_bytes() == whole  # the same content, embedded again
    assert OutputDir(out).current_version() == live  # the same vectors: nothing to publish


@pytest.mark.parametrize("mode", [0, 0o555], ids=["unreadable", "unwritable"])
@pytest.mark.parametrize("where", ["out", "versions", "store", "store/shards"])
def test_an_output_directory_petal_may_not_use_is_73_naming_it(built, tmp_path, where, mode):
    """OUT, OUT/versions, OUT/store or OUT/store/shards that petal may not read (000) or write (555): 73 naming it,
    one line, as OUT itself, and nothing changes. Before: the first path written under it was named (OUT/store/tmp,
    OUT/store/deleted, a shard key directory), or a store directory it may not list was the source shard's 66."""
    a, built_out = built
    out = tmp_path / "out"
    shutil.copytree(built_out, out)
    live = OutputDir(out).current_version()
    write_shard(tmp_path / "b.parquet")
    target = out if where == "out" else out / where
    target.chmod(mode)
    try:
        proc = petal(["index", str(a), str(tmp_path / "b.parquet"), "--out", str(out), "-q"])
    finally:
        target.chmod(0o755)
    assert proc.returncode == 73, (where, proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    if where == "out":  # judged before any work (safe_files.check_output_dir)
        assert f"{target}:" in last and ("cannot be read" if mode == 0 else "cannot be written") in last, last
    else:
        assert f"petal may not {'read' if mode == 0 else 'write'} {target} (permission denied)" in last, last
    assert OutputDir(out).current_version() == live and OutputDir(out).versions() == [live]


def test_a_committed_range_petal_may_not_read_is_66_on_resume_and_is_kept(tmp_path):
    """A resumed run (``--workers --range-rows``, the first killed after one range committed): a committed range
    (``OUT/store/parts``) petal may not read is 66 naming it, and kept (before: damaged, moved out, embedded again)."""
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(40)], "text": [f"row {i} of a shard" for i in range(40)]}),
                   data / "big.parquet", row_group_size=10)
    argv = ["index", str(data), "--out", str(out), "-q", "--range-rows", "20", "--workers", "1"]
    killed = petal(argv, unprivileged=False, env={"PETAL_FAULT": "store_committed:1:kill"})
    assert killed.returncode == 75, killed.stderr[-3000:]
    (part,) = (out / "store" / "parts").glob("*/*/g*")
    before = snapshot(part)
    target = part / "embeddings.npy"
    target.chmod(0)
    try:
        proc = petal(argv)
    finally:
        target.chmod(0o644)
    assert proc.returncode == 66, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert f"{target}: petal may not read it (permission denied)" in last, last
    assert "damaged" not in proc.stderr and snapshot(part) == before
    assert OutputDir(out).current_version() is None
