"""Permission denied that nothing mapped on its way up is classified by the path's role, in both catch-alls
(``cli/common.user_errors`` and ``pipeline/api._run``): inside an output the command names (``--out``/``OUT``, the
report, ``petal embed --output``) 73, on any other path (one petal reads) 66; never 74, which tells a scheduler to fix
the disk and retry. Before, neither catch-all said which paths were outputs, so every such error was 74.

Real ``petal`` processes without the capabilities that bypass file modes (``setpriv`` for root), real Parquet and
FAISS; ``petal embed`` with the packaged MiniLM.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO
from tests.test_input_files import run_unprivileged

DIM = 8


def last_line(proc: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("denied")
    for n, name in enumerate("ab"):
        flat = np.random.default_rng(n).standard_normal((30, DIM)).astype(np.float32).ravel()
        pq.write_table(pa.table({"id": np.arange(30) + 100 * n,
                                 "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                       root / f"{name}.parquet")
    proc = subprocess.run([sys.executable, "-m", "petal.cli.main", "index", str(root / "a.parquet"), "--out",
                           str(root / "out"), "-q", "--vectors-column", "emb"], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


@pytest.mark.parametrize("command", ["index", "rebuild"])
def test_an_output_directory_petal_may_not_enter_is_73_in_index_and_rebuild(built, tmp_path, command):
    """OUT/versions of mode 000: listing it (no write() around it) reached api._run's catch-all: 74 'I/O error on
    OUT/versions: Permission denied'. Now 73 naming it; the live version is left as it was."""
    out = tmp_path / "out"
    shutil.copytree(built / "out", out)
    live = (out / "CURRENT").read_text()
    argv = (["index", str(built / "a.parquet"), str(built / "b.parquet"), "--out", str(out), "-q",
             "--vectors-column", "emb"] if command == "index" else ["rebuild", str(out), "--index-factory", "Flat"])
    (out / "versions").chmod(0)
    try:
        proc = run_unprivileged(argv, tmp_path)
    finally:
        (out / "versions").chmod(0o755)
    assert proc.returncode == 73, (proc.returncode, proc.stderr[-2000:])
    last = last_line(proc)
    assert "cannot create output" in last and str(out / "versions") in last and "permission denied" in last, last
    assert (out / "CURRENT").read_text() == live


def test_embed_output_in_a_directory_petal_may_not_write_is_73(tmp_path, minilm_dir):
    """petal embed --output in a read-only directory: 74 'cannot write --output ...: Permission denied' after the
    texts were embedded. Now 73 naming --output; nothing is left beside it."""
    closed = tmp_path / "closed"
    closed.mkdir()
    closed.chmod(0o555)
    try:
        proc = run_unprivileged(["embed", "one text", "--output", str(closed / "rows.npy")], tmp_path)
    finally:
        closed.chmod(0o755)
    assert proc.returncode == 73, (proc.returncode, proc.stderr[-2000:])
    last = last_line(proc)
    assert f"--output {closed / 'rows.npy'}" in last and "permission denied" in last, last
    assert list(closed.iterdir()) == []


# A command declared with user_errors(outputs=("out",)), whose error comes up unmapped from a real open().
COMMAND = """
import sys
from pathlib import Path
import click
from petal.cli.common import user_errors

@click.command()
@click.argument("src", type=click.Path(path_type=Path, readable=False))
@click.option("--out", type=click.Path(path_type=Path))
@user_errors(outputs=("out",))
def copy(src, out):
    data = Path(src).read_bytes()
    (out / "copy").write_bytes(data)

@click.command()
@click.argument("src", type=click.Path(path_type=Path, readable=False))
@user_errors
def read_only(src):
    Path(src).read_bytes()

(copy if sys.argv[1] == "copy" else read_only).main(sys.argv[2:], prog_name="petal")
"""


def run_command(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", COMMAND, *argv]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: a file's mode cannot deny root a read")
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_user_errors_classifies_permission_denied_by_the_commands_outputs(tmp_path):
    """user_errors(outputs=...) names the parameters that are outputs: a denied write inside one is 73, a denied
    read elsewhere 66; a command that declares none keeps 74 (the role of the path is unknown)."""
    src, out = tmp_path / "src.bin", tmp_path / "out"
    src.write_bytes(b"x")
    out.mkdir()
    out.chmod(0o555)
    try:
        proc = run_command(tmp_path, "copy", str(src), "--out", str(out))
        assert proc.returncode == 73, proc.stderr[-2000:]
        assert f"petal may not write {out / 'copy'} (permission denied)" in last_line(proc)
    finally:
        out.chmod(0o755)
    src.chmod(0)
    try:
        proc = run_command(tmp_path, "copy", str(src), "--out", str(out))
        assert proc.returncode == 66, proc.stderr[-2000:]
        assert f"{src}: petal may not read it (permission denied)" in last_line(proc)
        proc = run_command(tmp_path, "read_only", str(src))
        assert proc.returncode == 74 and f"I/O error on {src}" in last_line(proc), proc.stderr[-2000:]
    finally:
        src.chmod(0o644)
