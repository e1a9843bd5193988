"""``petal verify``'s messages for a ``--version`` it cannot check, and the id in its ``--json``.

Before: ``petal verify OUT/versions/V2 --version V1`` (a version directory given as OUT) said
".../V2/versions/V1 is not a version of .../V2 (no manifest.json)", a path that never existed; ``--version`` naming a
version pruned (or never made) said "(no manifest.json)" of a directory that is not there, and named none that is;
``--json`` had ``version_dir`` but no ``version``, which ``petal info --json`` has. Now: the version directory is
named as one, with the output directory to give instead (78, as any ``--version`` that is no version of OUT); a
missing version is said to be missing, with the newest versions there and the live one (78); ``--json`` carries
``version``, the id.

Real ``petal`` processes (forked from a preloaded interpreter: tests/forkrun.py) with the tests' fake engine, real
Parquet and FAISS.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import forkrun
from tests.fake_engine import make_fake_model_dir

MISSING = "v000099-20200101T000000Z"


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OUT with 7 versions (kept with --keep-versions 10), one edition of data/a.parquet each."""
    root = tmp_path_factory.mktemp("verify-messages")
    model = make_fake_model_dir(root / "model")
    (root / "data").mkdir()
    env: dict[str, str | None] = {"PETAL_TEST_FAKE_ENGINE": str(root / "fake.jsonl")}
    for edition in range(7):
        pq.write_table(pa.table({"id": [f"d{i}" for i in range(4)],
                                 "text": [f"edition {edition} of document {i}" for i in range(4)]}),
                       root / "data" / "a.parquet")
        run = forkrun.petal(["index", str(root / "data"), "--out", str(root / "out"), "--model", str(model), "-q",
                             "--index-factory", "Flat", "--keep-versions", "10"], env, timeout=300)
        assert run.rc == 0, run.stderr[-3000:]
    assert len(versions(root / "out")) == 7
    return root / "out"


def versions(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "versions").iterdir() if not p.name.startswith("."))


def verify(*argv: object) -> forkrun.Result:
    return forkrun.petal(["verify", *map(str, argv)], timeout=300)


@pytest.mark.parametrize("as_json", [False, True])
def test_a_version_directory_given_as_out_with_version_is_named_as_one(out: Path, as_json: bool) -> None:
    first, *_, live = versions(out)
    given = out / "versions" / live
    run = verify(given, "--version", first, *(["--json"] if as_json else []))
    assert run.rc == 78 and "Traceback" not in run.stderr, (run.rc, run.stderr[-2000:])
    error = run.stderr.strip().splitlines()[-1]
    assert f"{given} is a version directory" in error, error
    assert f"petal verify {out} --version {first}" in error, error  # the output directory to give instead
    assert "no manifest.json" not in error and f"{given}/versions" not in error, error
    if as_json:
        assert json.loads(run.stdout) == {"ok": False, "error": json.loads(run.stdout)["error"], "exit_code": 78}


def test_a_version_directory_checked_alone_still_passes(out: Path) -> None:
    live = versions(out)[-1]
    run = verify(out / "versions" / live)
    assert run.rc == 0, run.stderr[-2000:]


@pytest.mark.parametrize("as_json", [False, True])
def test_a_version_not_in_versions_is_said_missing_naming_those_there(out: Path, as_json: bool) -> None:
    present = versions(out)
    run = verify(out, "--version", MISSING, *(["--json"] if as_json else []))
    assert run.rc == 78 and "Traceback" not in run.stderr, (run.rc, run.stderr[-2000:])
    error = run.stderr.strip().splitlines()[-1]
    assert "no manifest.json" not in error, error
    assert f"--version {MISSING}" in error and "not in" in error and "pruned" in error, error
    assert all(v in error for v in present[-5:]) and present[0] not in error, error  # the newest few, not all
    assert f"live: {present[-1]}" in error, error
    if as_json:
        assert json.loads(run.stdout)["exit_code"] == 78


def test_the_live_version_is_named_when_it_is_not_among_the_newest(out: Path, tmp_path: Path) -> None:
    """A rollback (CURRENT pointed back at an older version): the live one is named apart from the newest five."""
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    present = versions(copy)
    (copy / "CURRENT").write_text(present[0] + "\n")
    run = verify(copy, "--version", MISSING)
    assert run.rc == 78, run.stderr[-2000:]
    error = run.stderr.strip().splitlines()[-1]
    assert f"live: {present[0]}" in error and present[-1] in error, error


def test_a_version_directory_without_a_manifest_still_says_so(out: Path, tmp_path: Path) -> None:
    """A directory of that name that is there but holds no manifest.json: that is what is said (not 'not in')."""
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    (copy / "versions" / MISSING).mkdir()
    run = verify(copy, "--version", MISSING)
    assert run.rc == 78, run.stderr[-2000:]
    assert "no manifest.json" in run.stderr, run.stderr[-2000:]


def test_verify_json_names_the_version_as_info_json_does(out: Path, tmp_path: Path) -> None:
    first, *_, live = versions(out)
    for argv, version in (((out,), live), ((out, "--version", first), first), ((out / "versions" / first,), first)):
        run = verify(*argv, "--json")
        assert run.rc == 0, run.stderr[-2000:]
        report = json.loads(run.stdout)
        assert report["version"] == version and Path(report["version_dir"]).name == version, report
    copied = tmp_path / "srv-index"  # a version copied out under another name keeps its id, as info --json says
    shutil.copytree(out / "versions" / first, copied)
    run = verify(copied, "--json")
    assert run.rc == 0 and json.loads(run.stdout)["version"] == first, (run.stdout, run.stderr[-2000:])
    info = forkrun.petal(["info", str(out), "--json"], timeout=300)
    assert info.rc == 0, info.stderr[-2000:]
    assert json.loads(info.stdout)["version"] == json.loads(verify(out, "--json").stdout)["version"] == live
