"""A version id names one index for the life of OUT: a number once handed out is never handed out again, and a new
id sorts after every id on disk.

Before: ``new_version_id`` numbered a version as the highest on disk + 1. After a rollback by hand (``echo vOLD >
OUT/CURRENT``) the next run removed the versions newer than the live one and published under the number of the one
it removed (in the same second, its very id); a run killed between the rename and the pointer swap, rerun, did the
same. A ``petal serve`` that followed the old id, a report or a client that logged it then saw one id naming two
indexes. Now ``OUT/.last-version`` records each id before its version is written; a missing, garbage or unreadable
mark (an OUT of an older petal) falls back to the versions on disk, says so, and never gives out a whole id again.

Real ``petal index`` processes (``tests.fake_cli``: petal with the tests' fake engine, forked from a preloaded
interpreter: tests/_perms_shared.py) over small Parquet shards, real FAISS and store.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import VERSION_RE, OutputDir
from tests import _perms_shared as perms
from tests.fake_engine import make_fake_model_dir

TEXTS = ["glaciers flow downhill under their own weight", "a recipe for sourdough bread",
         "the tides follow the moon", "volcanoes erupt molten rock"]


def write_shard(data: Path, name: str, edition: int) -> None:
    data.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [f"{name}-{i}" for i in range(len(TEXTS))],
                             "text": [f"{text} (edition {edition})" for text in TEXTS]}), data / f"{name}.parquet")


FAKE: dict[str, Path] = {}


@pytest.fixture(scope="module", autouse=True)
def fake_model(tmp_path_factory) -> None:
    FAKE["model"] = make_fake_model_dir(tmp_path_factory.mktemp("model"))


def index(data: Path, out: Path, env: dict[str, str] | None = None,
          unprivileged: bool = False) -> subprocess.CompletedProcess:
    """``petal index DATA --out OUT`` with the fake engine in its own process (forked from a preloaded interpreter:
    tests/_perms_shared.py); ``unprivileged``: for root, without the capabilities that bypass file permissions, so a
    file's mode can deny a read."""
    argv = ["index", str(data), "--out", str(out), "--model", str(FAKE["model"]), "-q"]
    fake = {"PETAL_TEST_FAKE_ENGINE": str(FAKE["model"].parent / "fake.jsonl")}
    run = perms.petal(argv, env={**fake, **(env or {})}, unprivileged=unprivileged, timeout=600)
    return subprocess.CompletedProcess(["petal", *argv], run.rc, run.stdout, run.stderr)


def succeeds(data: Path, out: Path) -> tuple[str, str]:
    """A run that publishes a new version: (its id, stderr)."""
    before = OutputDir(out).current_version() if out.exists() else None
    run = index(data, out)
    assert run.returncode == 0, run.stderr[-3000:]
    version = OutputDir(out).current_version()
    assert version is not None and version != before, run.stderr
    return version, run.stderr


def number(version: str) -> int:
    assert VERSION_RE.match(version), version
    return int(version[1:7])


def mark(out: Path) -> str:
    return (out / ".last-version").read_text().strip()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str, str]:
    """v1 from shard a; a edited, v2 (live). Returns (root, v1, v2); a test copies ROOT's data and out."""
    root = tmp_path_factory.mktemp("version-ids")
    data, out = root / "data", root / "out"
    write_shard(data, "a", 1)
    v1, _ = succeeds(data, out)
    write_shard(data, "a", 2)
    v2, _ = succeeds(data, out)
    assert (number(v1), number(v2)) == (1, 2) and mark(out) == v2
    return root, v1, v2


def copy(built, tmp_path) -> tuple[Path, Path, str, str]:
    """A copy of the built OUT and its data (under another path, so the next run has a shard to publish):
    (data, out, v1, v2)."""
    root, v1, v2 = built
    shutil.copytree(root / "data", tmp_path / "data")
    shutil.copytree(root / "out", tmp_path / "out", symlinks=True)
    return tmp_path / "data", tmp_path / "out", v1, v2


def roll_back(out: Path, version: str) -> None:
    (out / "CURRENT").write_text(f"{version}\n")  # README "rollback"


def test_a_run_after_a_rollback_never_reuses_the_number_of_the_version_it_removes(built, tmp_path):
    data, out, v1, v2 = copy(built, tmp_path)
    roll_back(out, v1)
    v3, stderr = succeeds(data, out)
    assert OutputDir(out).versions() == [v1, v3]  # v2, newer than the live v1, went once the run published
    assert number(v3) == 3 and v3 not in (v1, v2) and v3 > v2 > v1, (v1, v2, v3)
    notes = [line for line in stderr.splitlines() if "note" in line]  # only the removal, said
    assert mark(out) == v3 and len(notes) == 1 and f"note: removed {v2} (newer than" in notes[0], stderr
    roll_back(out, v1)  # and again: v3 goes, its number stays taken
    write_shard(data, "a", 3)
    v4, _ = succeeds(data, out)
    assert OutputDir(out).versions() == [v1, v4] and number(v4) == 4 and v4 > v3, (v3, v4)


def test_a_run_killed_before_its_pointer_swap_then_rerun_gets_a_new_number(built, tmp_path):
    """The version of a run killed between the rename and the pointer swap was never live; the rerun removes it and
    publishes under a number of its own (before: the same number, in the same second the same id)."""
    data, out, _, v2 = copy(built, tmp_path)
    killed = index(data, out, {"PETAL_FAULT": "before_current_swap:1:kill"})
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    orphan = OutputDir(out).versions()[-1]
    assert number(orphan) == 3 and OutputDir(out).current_version() == v2
    rerun, _ = succeeds(data, out)
    assert number(rerun) == 4 and rerun > orphan and OutputDir(out).versions() == [v2, rerun]


def test_two_ids_handed_out_in_the_same_second_differ(built, tmp_path):
    """Nothing published between two ``new_version_id`` calls (a run that dies before its publish, then the next):
    before, the same second gave the same id."""
    _, out, _, v2 = copy(built, tmp_path)
    layout = OutputDir(out)
    with layout.lock():
        for _ in range(20):
            first, second = layout.new_version_id(), layout.new_version_id()
            if first[8:] == second[8:]:  # the same second (else try again)
                break
        else:
            pytest.fail("no two calls in the same second")
    assert first != second and second > first > v2
    assert number(second) == number(first) + 1 and mark(out) == second


@pytest.mark.parametrize("kind", ["deleted", "garbage", "empty", "behind"])
@pytest.mark.parametrize("rollback", [False, True], ids=["live v2", "rolled back to v1"])
def test_a_missing_or_bad_mark_falls_back_to_the_versions_on_disk_and_says_so(built, tmp_path, kind, rollback):
    """Also an OUT an older petal wrote (no mark). Rolled back, the versions the run removes are recorded first:
    their numbers stay taken even then."""
    data, out, v1, v2 = copy(built, tmp_path)
    path = out / ".last-version"
    if kind == "deleted":
        path.unlink()
    elif kind == "garbage":
        path.write_bytes(b"\x00\xffnot a version id\n" * 40)
    elif kind == "empty":
        path.write_bytes(b"")
    else:  # a valid id behind the versions on disk (an older copy restored): the versions on disk win, unsaid
        path.write_text(f"{v1}\n")
    if rollback:
        roll_back(out, v1)
    v3, stderr = succeeds(data, out)
    assert number(v3) == 3 and v3 > v2 and mark(out) == v3, (v3, mark(out), stderr)
    assert OutputDir(out).versions() == ([v1, v3] if rollback else [v2, v3])
    assert "Traceback" not in stderr
    notes = [line for line in stderr.splitlines() if ".last-version" in line]
    if kind == "behind":
        assert not notes, stderr
    else:
        assert len(notes) == 1 and notes[0].startswith("petal: note:") and str(path) in notes[0], stderr
        assert v2 in notes[0], notes[0]


def test_an_unreadable_mark_is_said_and_replaced_not_a_crash(built, tmp_path):
    data, out, _, v2 = copy(built, tmp_path)
    path = out / ".last-version"
    path.chmod(0)
    proc = index(data, out, unprivileged=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    v3 = OutputDir(out).current_version()
    assert v3 is not None and number(v3) == 3 and v3 > v2 and mark(out) == v3
    note = next(line for line in proc.stderr.splitlines() if ".last-version" in line)
    assert note.startswith("petal: note: cannot read") and "Permission denied" in note, note


def test_a_directory_in_place_of_the_mark_is_73_naming_it(built, tmp_path):
    data, out, _, v2 = copy(built, tmp_path)
    path = out / ".last-version"
    path.unlink()
    path.mkdir()
    run = index(data, out)
    assert run.returncode == 73, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert str(path) in last and "Traceback" not in run.stderr, last
    assert OutputDir(out).current_version() == v2 and OutputDir(out).versions()[-1] == v2
    assert not list((out / "versions").glob(".staging-*"))
