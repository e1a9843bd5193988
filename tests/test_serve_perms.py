"""``petal serve`` classifies permission denied by the path's role, as ``petal query`` / ``index`` / ``embed`` do: it
writes no file, so a path it may not read (OUT, a version's files, the model directory, given with ``--model`` or
recorded in the index) is 66, one line naming the path. Before: its bare catch-all made such an error 74 (an I/O
error: fix the disk and retry), and click's own check made an unreadable OUT a usage error (2).

Real ``petal`` processes without the capabilities that bypass file modes (``setpriv`` when run as root), real
chmod-000 files and directories, a real tiny checkpoint and ``petal index``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO
from tests.tiny_models import make_model

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

START_S = 120  # each case fails before the server listens; a server that starts instead is stopped here


def unprivileged(argv: list[str]) -> list[str]:
    """``argv`` in a process that a file's mode denies (root: without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH)."""
    if os.geteuid() != 0:
        return argv
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a file's mode cannot deny root a read")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *argv]


@pytest.fixture(scope="module")
def denial_is_real(tmp_path_factory) -> None:
    """Skip unless a chmod-000 file really cannot be read by the processes these tests start."""
    probe = tmp_path_factory.mktemp("probe") / "closed"
    probe.write_text("x")
    probe.chmod(0)
    try:
        proc = subprocess.run(unprivileged([sys.executable, "-c", f"open({str(probe)!r}).read()"]),
                              capture_output=True, text=True, timeout=60)
    finally:
        probe.chmod(0o644)
    if proc.returncode == 0:
        pytest.skip("a chmod-000 file is still readable here (root with capabilities that setpriv cannot drop)")


def serve(tmp_path: Path, *argv: object) -> subprocess.CompletedProcess[str]:
    command = unprivileged([sys.executable, "-m", "petal.cli.main", "serve", "--port", "0", "--log-level", "warning",
                            *map(str, argv)])
    try:
        return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=START_S,
                              env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired as exc:  # it started serving: the error was not seen
        raise AssertionError(f"petal serve ran instead of refusing: {exc.stderr!r}") from None


def refused_66(proc: subprocess.CompletedProcess[str], path: Path) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 66, (proc.returncode, proc.stderr[-2000:])
    assert last.startswith("petal: error: ") and str(path) in last and "may not read it (permission denied)" in last, \
        last


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """A tiny model (a copy petal may be denied) and an index that ``petal index`` built with it."""
    root = tmp_path_factory.mktemp("serve-perms")
    model = root / "model"
    make_model("bert", model)
    pq.write_table(pa.table({"id": [1, 2], "text": ["glaciers move", "vector search"]}), root / "docs.parquet")
    proc = subprocess.run([sys.executable, "-m", "petal.cli.main", "index", str(root / "docs.parquet"), "--out",
                           str(root / "out"), "--model", str(model), "-q"], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"root": root, "model": model, "out": root / "out",
            "version": next((root / "out" / "versions").iterdir())}


def closed(path: Path):
    """``path`` at mode 000 for the ``with`` block."""
    mode = path.stat().st_mode & 0o777

    class Closed:
        def __enter__(self) -> Path:
            path.chmod(0)
            return path

        def __exit__(self, *exc: object) -> None:
            path.chmod(mode)

    return Closed()


def test_an_out_petal_may_not_read_is_66_not_a_usage_error(built, denial_is_real, tmp_path):
    """Was 2: "Invalid value for '[OUT]': Path ... is not readable" (click's check)."""
    with closed(built["out"]):
        proc = serve(tmp_path, built["out"])
    refused_66(proc, built["out"])


def test_a_model_directory_petal_may_not_read_is_66(built, denial_is_real, tmp_path):
    """--model DIR (embeddings only), and the model an index records (loaded on the server's load thread): was 74
    "I/O error on DIR/config.json: Permission denied"."""
    for argv in (["--model", built["model"]], [built["out"]]):
        with closed(built["model"]):
            proc = serve(tmp_path, *argv)
        refused_66(proc, built["model"])


def test_the_files_of_the_version_served_are_66(built, denial_is_real, tmp_path):
    for name in ("manifest.json", "index.faiss", "ids.parquet"):
        with closed(built["version"] / name):
            proc = serve(tmp_path, built["out"])
        refused_66(proc, built["version"] / name)
    with closed(built["out"] / "CURRENT"):
        proc = serve(tmp_path, built["out"])
    refused_66(proc, built["out"] / "CURRENT")
