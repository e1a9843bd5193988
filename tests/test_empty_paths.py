"""An empty path (``""``: an unset variable, ``--out "$OUT"``) is a usage error naming the argument, on every command
and in the Python API, never the current directory that ``Path("")`` makes of it, nor the packaged model.

Before: ``petal index SRC --out ""`` wrote ``CURRENT``, ``versions/`` and ``store/`` into the working directory;
``petal info ""``/``query ""``/``verify ""``/``rebuild ""``/``serve ""`` opened (or rebuilt, or served) the index
there; ``--model ""`` embedded with the packaged MiniLM; ``--json-report ""`` and ``json_report=""`` warned that "."
is a directory after the run; ``--delete ""`` and ``--vector-file ""`` said "." is a directory (66). The working
directory of each case holds an index (precomputed vectors, so no model loads), so a path taken for "." shows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import petal
from petal.cli.main import cli

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("src") / "v.parquet"
    rows = np.random.default_rng(0).standard_normal((12, 8)).astype(np.float32)
    pq.write_table(pa.table({"id": [str(i) for i in range(12)], "text": [f"text {i}" for i in range(12)],
                             "emb": list(rows)}), path)
    return path


@pytest.fixture
def cwd_index(shard, tmp_path, monkeypatch) -> Path:
    """The working directory, holding an index of 12 precomputed vectors: what "" would wrongly name."""
    cwd = tmp_path / "cwd"
    petal.index(shard, cwd, vectors_column="emb", quiet=True)
    monkeypatch.chdir(cwd)
    return cwd


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


CLI_CASES = {
    "index --out": ["index", "{shard}", "--out", ""],
    "index --json-report": ["index", "{shard}", "--out", "{tmp}/o", "--json-report", ""],
    "index --delete": ["index", "{shard}", "--out", "{tmp}/o", "--delete", ""],
    "index --model": ["index", "{shard}", "--out", "{tmp}/o", "--model", ""],
    "rebuild OUT": ["rebuild", ""],
    "rebuild --json-report": ["rebuild", ".", "--json-report", ""],
    "info INDEX": ["info", ""],
    "verify OUT": ["verify", ""],
    "query INDEX": ["query", "", "--vector-file", "{tmp}/q.npy"],
    "query --vector-file": ["query", ".", "--vector-file", ""],
    "query --model": ["query", ".", "hello", "--model", ""],
    "embed --model": ["embed", "hello", "--model", ""],
    "embed --output": ["embed", "hello", "--output", ""],
    "embed --input": ["embed", "--input", ""],
    "embed --calibration": ["embed", "hello", "--quantize", "int8", "--calibration", ""],
    "bench startup --workdir": ["bench", "startup", "--workdir", ""],
    "bench serve --index": ["bench", "serve", "--index", ""],
    "bench cpu --corpus": ["bench", "cpu", "--corpus", ""],
    "bench cpu --model": ["bench", "cpu", "--model", ""],
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_an_empty_path_on_the_command_line_is_a_usage_error(case, cwd_index, shard, tmp_path):
    np.save(tmp_path / "q.npy", np.ones((1, 8), np.float32))
    args = [a.format(shard=shard, tmp=tmp_path) for a in CLI_CASES[case]]
    named = args[args.index("") - 1] if args.index("") > 1 and args[args.index("") - 1].startswith("--") else None
    before = _listing(cwd_index)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, (case, result.output)
    assert "an empty path" in result.output, result.output
    assert "warning" not in result.output  # --json-report "": no report written there, nor said to fail
    if named is not None:
        assert f"'{named}'" in result.output, result.output
    assert _listing(cwd_index) == before  # nothing written into the working directory
    assert not (tmp_path / "o").exists()  # and no run started


def test_serve_with_an_empty_path_exits_2_before_it_listens(cwd_index):
    """``petal serve ""`` served the working directory's index (it would never exit); ``--model ""`` the packaged
    model."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for args in (["serve", "", "--port", "0"], ["serve", ".", "--model", "", "--port", "0"]):
        done = subprocess.run([sys.executable, "-m", "petal.cli.main", *args], capture_output=True, text=True,
                              timeout=120, env=env, cwd=cwd_index)
        assert done.returncode == 2, done.stderr
        assert "an empty path" in done.stderr and "listening" not in done.stderr


def test_an_empty_path_in_the_python_api_is_a_usage_error(cwd_index, shard, tmp_path, capfd):
    """The API's path keywords: ``json_report=""`` ran and warned that "." is a directory; ``model=""`` took the
    packaged model (``petal.index``, ``Embedder``, ``open_index``, ``Index``)."""
    before = _listing(cwd_index)
    calls = {
        "json_report": lambda: petal.index(shard, tmp_path / "o", vectors_column="emb", json_report=""),
        "delete": lambda: petal.index(shard, tmp_path / "o", vectors_column="emb", delete=""),
        "model": lambda: petal.index(shard, tmp_path / "o", model=""),
        "rebuild json_report": lambda: petal.rebuild(".", json_report=""),
        "Embedder model": lambda: petal.Embedder(model=""),
        "Embedder calibration": lambda: petal.Embedder(calibration="", quantize="int8"),
        "open_index model": lambda: petal.open_index(".", model=""),
        "Index model": lambda: petal.Index(".", model=""),
    }
    for name, call in calls.items():
        with pytest.raises(petal.UsageError, match=r"an empty path") as caught:
            call()
        assert caught.value.exit_code == 2, name
        report = getattr(caught.value, "report", None)
        assert report is None or report.exit_code == 2, name
    assert "cannot write the report" not in capfd.readouterr().err
    assert _listing(cwd_index) == before and not (tmp_path / "o").exists()
    assert petal.open_index(".").num_vectors == 12  # "." itself still opens: only "" is refused


@pytest.mark.parametrize("args", [
    ["serve", ".", "--host", "", "--port", "0"],  # bound every interface: an unset $HOST served the index publicly
    ["serve", ".", "--served-model-name", ""],  # fell back to the directory's name
    ["index", "{shard}", "--out", "{tmp}/o", "--vectors-column", ""],  # read every shard, then 65 "'' is missing"
])
def test_an_empty_value_with_no_meaning_is_a_usage_error(args, cwd_index, shard, tmp_path):
    args = [a.format(shard=shard, tmp=tmp_path) for a in args]
    flag = args[args.index("") - 1]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert flag in result.output and "must not be empty" in result.output, result.output
    assert not (tmp_path / "o").exists()
    if flag == "--vectors-column":
        with pytest.raises(petal.UsageError, match=r"^vectors_column must not be empty"):
            petal.index(shard, tmp_path / "o", vectors_column="")
        assert not (tmp_path / "o").exists()
