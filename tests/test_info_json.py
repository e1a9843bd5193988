"""``petal info OUT --json`` prints one JSON object on stdout on every outcome, as ``petal verify --json`` does.

Before: a failure before the manifest was read (no such path, not an index, a bad or unreadable CURRENT, a damaged or
unsafe manifest, an I/O error, a usage error) printed nothing on stdout, only the error on stderr, so
``petal info OUT --json | jq`` got no object. Now: ``{"ok": false, "error": MESSAGE, "exit_code": N}`` (verify's
failure keys), the exit code and stderr as without ``--json``. A damaged file found after the manifest was read: the
manifest's object, as before, with the same three keys added.

Real indexes built by ``petal index --vectors-column`` (real Parquet, real FAISS), every run a real petal process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO
from tests.forkrun import petal
from tests.test_serve_perms import denial_is_real, unprivileged  # noqa: F401  (a fixture)

DIM = 8


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("info-json")
    ids = list(range(1, 9))
    flat = np.random.default_rng(3).standard_normal((len(ids), DIM)).astype(np.float32).ravel()
    (root / "data").mkdir()
    pq.write_table(pa.table({"id": ids, "text": [f"document {i}" for i in ids],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                   root / "data" / "a.parquet")
    proc = petal(["index", root / "data", "--out", root / "out", "--vectors-column", "emb", "-q"])
    assert proc.rc == 0, proc.stderr[-2000:]
    return root / "out"


def live(out: Path) -> Path:
    return out / "versions" / (out / "CURRENT").read_text().strip()


def _fifo_manifest(out: Path) -> None:
    manifest = live(out) / "manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)


def _missing_key(out: Path) -> None:
    manifest = live(out) / "manifest.json"
    data = json.loads(manifest.read_text())
    del data["dim"]
    manifest.write_text(json.dumps(data))


# name -> (damage made to a copy of the index, the path given to petal info, exit code, words of the message)
CASES: dict[str, tuple[Callable[[Path], None], Callable[[Path], object], int, str]] = {
    "no such path": (lambda out: None, lambda out: out.parent / "missing", 78, "is not a petal index"),
    "an empty directory": (lambda out: None, lambda out: out.parent, 78, "is not a petal index"),
    "a file": (lambda out: None, lambda out: out / "CURRENT", 78, "is not a petal index"),
    "CURRENT not a version id": (lambda out: (out / "CURRENT").write_text("../../etc\n"), lambda out: out, 78,
                                 "which is not a petal version id"),
    # NOTE: bytes that are not UTF-8 quoted as escapes (were U+FFFD: the bytes lost)
    "CURRENT not UTF-8": (lambda out: (out / "CURRENT").write_bytes(b"\xff\xfe" * 4 + b"\n"), lambda out: out, 78,
                          'holds "\\xff\\xfe\\xff\\xfe\\xff\\xfe\\xff\\xfe", which is not a petal version id'),
    # NOTE: a pointer that starts with a valid id was shown cut at 24 characters, the id alone ("v...Z"...)
    "CURRENT an id and more": (lambda out: (out / "CURRENT").write_text("v000001-20990101T000000Z.bak\n"),
                               lambda out: out, 78, 'holds "v000001-20990101T000000Z.bak", which is not'),
    "CURRENT two ids": (lambda out: (out / "CURRENT").write_text("v000001-20990101T000000Z\n"
                                                                 "v000002-20990101T000000Z\n"), lambda out: out, 78,
                        'holds "v000001-20990101T000000Z\\nv000002-20990101T000000Z", which is not'),
    "CURRENT empty": (lambda out: (out / "CURRENT").write_text(" \n"), lambda out: out, 78,
                      "CURRENT is empty (or only blank): it names no petal version id"),
    "CURRENT names a missing version": (lambda out: (out / "CURRENT").write_text("v999999-20990101T000000Z\n"),
                                        lambda out: out, 78, "names v999999-20990101T000000Z, which is not in"),
    "CURRENT a directory": (lambda out: ((out / "CURRENT").unlink(), (out / "CURRENT").mkdir()), lambda out: out, 78,
                            "CURRENT"),
    "manifest not JSON": (lambda out: (live(out) / "manifest.json").write_text("{not json"), lambda out: out, 78,
                          "a damaged version: cannot read the manifest"),
    "manifest missing": (lambda out: (live(out) / "manifest.json").unlink(), lambda out: out, 78,
                         "a damaged version: cannot read the manifest"),
    "manifest a FIFO": (_fifo_manifest, lambda out: out, 78, "manifest.json"),
    "manifest without a key": (_missing_key, lambda out: out, 78, "dim"),
    "version dir, manifest not JSON": (lambda out: (live(out) / "manifest.json").write_text("[]"), live, 78,
                                       "is not a JSON object"),
    "a name too long (I/O error)": (lambda out: None, lambda out: out / ("x" * 300), 74, "File name too long"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_failure_before_the_manifest_is_one_json_object(built, tmp_path, case):
    damage, target, code, words = CASES[case]
    out = tmp_path / "idx" / "out"
    shutil.copytree(built, out)
    damage(out)
    path = target(out)
    plain, as_json = petal(["info", path]), petal(["info", path, "--json"])
    assert plain.rc == as_json.rc == code, (case, plain.rc, as_json.rc, as_json.stderr[-2000:])
    assert as_json.stderr == plain.stderr and plain.stdout == "", (as_json.stderr, plain.stdout)
    assert "Traceback" not in as_json.stderr and words in as_json.last_line, as_json.last_line
    lines = as_json.stdout.splitlines()
    assert len(lines) == 1, as_json.stdout  # was "": nothing on stdout
    assert json.loads(lines[0]) == {"ok": False, "error": as_json.last_line.removeprefix("petal: error: "),
                                    "exit_code": code}


@pytest.mark.parametrize("argv", [["info", "", "--json"], ["info", "--json"], ["info", "--json", "--bogus", "x"]])
def test_a_usage_error_with_json_is_one_json_object(argv):
    """``petal info "$OUT" --json`` with OUT unset: exit 2 and click's usage error on stderr, as before, and now the
    object on stdout too."""
    proc = petal(argv)
    assert proc.rc == 2, proc.stderr
    assert proc.last_line.startswith("Error: ") and "Usage: petal info" in proc.stderr, proc.stderr
    assert json.loads(proc.stdout) == {"ok": False, "error": proc.last_line.removeprefix("Error: "), "exit_code": 2}
    assert petal([a for a in argv if a != "--json"]).stdout == ""  # without --json stdout stays empty
    proc = petal(["info", "--", "--json"])  # after the separator "--json" is INDEX, no flag
    assert proc.rc == 78 and proc.stdout == "" and "--json is not a petal index" in proc.last_line, proc.stderr


def test_a_damaged_file_after_the_manifest_adds_the_failure_keys(built, tmp_path):
    """The manifest was read: it is printed as before (exit 65 as petal query's open), with ok/error/exit_code."""
    out = tmp_path / "out"
    shutil.copytree(built, out)
    ids = live(out) / "ids.parquet"
    ids.write_bytes(ids.read_bytes()[:-5])
    proc = petal(["info", out, "--json"])
    assert proc.rc == 65 and "ids.parquet" in proc.last_line, proc.stderr
    report = json.loads(proc.stdout)
    assert report["dim"] == DIM and report["path"] == str(live(out))  # the manifest, as before
    assert report["ok"] is False and report["exit_code"] == 65
    assert report["error"] == proc.last_line.removeprefix("petal: error: ")
    healthy = json.loads(petal(["info", built, "--json"]).stdout)
    assert not {"ok", "error", "exit_code"} & set(healthy)  # a sound index: the manifest alone


@pytest.mark.usefixtures("denial_is_real")
def test_an_index_petal_may_not_read_is_66_and_one_json_object(built, tmp_path):
    """Permission denied on OUT and on CURRENT: 66 naming it (a real unprivileged process)."""
    out = tmp_path / "out"
    shutil.copytree(built, out)
    for closed in (out / "CURRENT", out):
        mode = closed.stat().st_mode & 0o777
        closed.chmod(0)
        try:
            proc = subprocess.run(unprivileged([sys.executable, "-m", "petal.cli.main", "info", str(out), "--json"]),
                                  capture_output=True, text=True, cwd=REPO, timeout=120, stdin=subprocess.DEVNULL)
        finally:
            closed.chmod(mode)
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 66 and str(closed) in last, (closed, proc.returncode, proc.stderr[-2000:])
        assert json.loads(proc.stdout) == {"ok": False, "error": last.removeprefix("petal: error: "), "exit_code": 66}


@pytest.mark.parametrize("argv, code", [(["verify", "", "--json"], 2), (["verify", "--json"], 2),
                                        (["verify", Path("/tmp") / ("x" * 300), "--json"], 74)])
def test_verify_json_is_one_object_on_a_usage_or_io_error_too(argv, code):
    """petal verify --json promised one object "in every case" but printed none on a usage error (2) or an OSError
    nothing mapped (74: a name too long); the same object now, stderr as before."""
    proc = petal(argv)
    assert proc.rc == code and "Traceback" not in proc.stderr, proc.stderr
    said = proc.last_line.removeprefix("Error: ").removeprefix("petal: error: ")
    assert json.loads(proc.stdout) == {"ok": False, "error": said, "exit_code": code}


def test_the_api_info_is_what_info_json_prints(built):
    """``Index.info`` is "the manifest as ``petal info --json`` prints it" (README): the same object, ``path`` (the
    version directory) included, whether the index is opened by OUT or by its version directory. It lacked ``path``."""
    import petal as api

    for given in (built, live(built)):
        printed = json.loads(petal(["info", given, "--json"]).stdout)
        assert printed["path"] == str(live(built))
        with api.open_index(given) as index:
            assert index.info == printed


def test_the_api_info_path_is_the_version_directory_as_given_as_info_json_prints_it(built, monkeypatch):
    """A relative path: ``petal info out --json`` printed "out/versions/v...", ``Index.info`` the absolute path (the
    README says they are the same object; ``petal.verify``'s ``version_dir`` is as given too). ``Index.path`` stays
    absolute (a later chdir must not move the index)."""
    import petal as api

    monkeypatch.chdir(built.parent)
    version = live(built).name
    for given in ("out", "./out", f"out/versions/{version}", str(built.parent / "data" / ".." / "out")):
        command = [sys.executable, "-m", "petal.cli.main", "info", given, "--json"]
        printed = json.loads(subprocess.run(command, capture_output=True, text=True, cwd=built.parent, timeout=120,
                                            env={**os.environ, "PYTHONPATH": str(REPO)}).stdout)
        with api.open_index(given) as index:
            assert index.info == printed, given
            assert index.path.is_absolute() and index.path.samefile(live(built))
        expected = Path(given) if "versions" in given else Path(given) / "versions" / version
        assert printed["path"] == str(expected)
        assert api.verify(given).version_dir == expected
