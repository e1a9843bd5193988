"""Input files and empty inputs of ``petal query``, ``petal embed`` and ``petal index``, one rule for every flag.

- An input file a flag names (``query --vector-file``, ``embed --input``, ``index --delete``) that is missing, a
  directory, a FIFO or unreadable is no input: exit 66 naming the flag and the path, before any model or index
  loads (was: 2 from click's path check for an unreadable one, 2 for a missing or directory ``--vector-file``, 1
  "Aborted!" for a 0-byte one; ``--delete``: 2 for an unreadable one, 66 "no such file" for a directory or FIFO).
- A file that opens but is not what the flag takes is bad input (65): ``--vector-file`` of junk, of the wrong
  shape, dtype or dimension, with NaN (was: 2, a usage error; the flag's value, a path, is fine); a ``--delete``
  that is not Parquet (0 bytes too) or has no id column.
- An input given that holds nothing to do (an empty or blank-only ``--stdin``, blank TEXT only, a 0-byte
  ``--input`` of any format) is no input, 66, in both commands (was: ``petal query --stdin`` of nothing exited 0).
"""

from __future__ import annotations

import json
import os
import shutil
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
from petal.pipeline.layout import OutputDir
from petal.pipeline.reliability.errors import NoInputError
from tests.conftest import REPO
from tests.fake_cli import invoke as fake_invoke
from tests.fake_engine import make_fake_model_dir


def invoke(*args: object, stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args], input=stdin)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def text_index(tmp_path_factory, minilm_dir) -> Path:
    """A 3-document index built with the packaged MiniLM (text queries load it)."""
    root = tmp_path_factory.mktemp("inputs")
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["glaciers flow downhill", "bread needs yeast", "lava"]}),
                   root / "docs.parquet")
    code, _, stderr = invoke("index", root / "docs.parquet", "--out", root / "out", "-q")
    assert code == 0, stderr
    return root / "out"


def bad_files(tmp_path: Path, suffix: str) -> dict[str, Path]:
    """A missing file, a directory, a FIFO and a 0-byte file, each named like an input of ``suffix``."""
    (tmp_path / f"dir{suffix}").mkdir()
    os.mkfifo(tmp_path / f"fifo{suffix}")
    (tmp_path / f"empty{suffix}").write_bytes(b"")
    return {"missing": tmp_path / f"missing{suffix}", "directory": tmp_path / f"dir{suffix}",
            "fifo": tmp_path / f"fifo{suffix}", "empty": tmp_path / f"empty{suffix}"}


SAID = {"missing": "no such file", "directory": "is a directory", "fifo": "not a regular file", "empty": "is empty"}


def test_vector_file_that_is_not_there_or_not_a_file_is_no_input_naming_flag_and_path(tmp_path):
    """Before the index opens: the index path does not even exist (was: 2, 2, a hang-free 2, and 1 'Aborted!')."""
    for kind, path in bad_files(tmp_path, ".npy").items():
        code, _, stderr = invoke("query", tmp_path / "no-index", "--vector-file", path, "-k", "1")
        assert code == 66, (kind, code, stderr)
        assert f"--vector-file {path}" in stderr and SAID[kind] in stderr, (kind, stderr)


@pytest.mark.parametrize("suffix", [".txt", ".jsonl", ".parquet"])
def test_embed_input_that_is_not_there_or_not_a_file_is_no_input_naming_flag_and_path(tmp_path, suffix):
    """The same rule for --input of every format, before the model loads; a 0-byte .parquet holds no rows (was:
    65, a corrupt Parquet file, while a 0-byte .txt or .jsonl was 66)."""
    for kind, path in bad_files(tmp_path, suffix).items():
        code, _, stderr = invoke("embed", "--input", path)
        assert code == 66, (kind, code, stderr)
        assert f"--input {path}" in stderr and SAID[kind] in stderr, (kind, stderr)


def test_an_empty_input_file_beside_other_texts_is_fine(tmp_path, minilm_dir):
    (tmp_path / "empty.parquet").write_bytes(b"")
    code, stdout, stderr = invoke("embed", "a text", "--input", tmp_path / "empty.parquet")
    assert code == 0, stderr
    assert [json.loads(line)["index"] for line in stdout.splitlines()] == [0]


def run_unprivileged(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``petal ARGV`` in a fresh process that cannot read a file its mode denies: as is for a normal user; for
    root, without the capabilities that bypass file permissions (setpriv)."""
    command = [sys.executable, "-m", "petal.cli.main", *argv]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: a file's mode cannot deny root a read")
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_unreadable_input_files_are_no_input_in_every_command(tmp_path):
    """Permission denied: 66 naming the flag and the file, one line, no traceback (was: 2, click's 'Path ... is not
    readable'; ``petal index --delete`` too)."""
    vectors = tmp_path / "q.npy"
    np.save(vectors, np.ones((1, 8), np.float32))
    texts = tmp_path / "texts.txt"
    texts.write_text("one\ntwo\n")
    index_argv = vector_index_argv(tmp_path)
    deletes = tmp_path / "deletes.parquet"
    pq.write_table(pa.table({"id": pa.array([2], pa.int64())}), deletes)
    for path in (vectors, texts, deletes):
        path.chmod(0)
    try:
        for flag, path, argv in (
                ("--vector-file", vectors, ["query", str(tmp_path / "no-index"), "--vector-file", str(vectors)]),
                ("--input", texts, ["embed", "--input", str(texts)]),
                ("--delete", deletes, [*index_argv, "--delete", str(deletes)])):
            proc = run_unprivileged(argv, tmp_path)
            assert proc.returncode == 66, (flag, proc.returncode, proc.stderr[-2000:])
            assert f"{flag} {path}: cannot be read (Permission denied)" in proc.stderr, proc.stderr[-2000:]
            assert "Traceback" not in proc.stderr and proc.stderr.splitlines()[-1].startswith("petal: error: ")
    finally:
        for path in (vectors, texts, deletes):
            path.chmod(0o644)
    assert not (tmp_path / "out" / "CURRENT").exists()  # refused before anything was published


def vector_index_argv(root: Path) -> list[str]:
    """``petal index DOCS --out ROOT/out`` of 3 precomputed vectors (no model), its shard written (with text too)."""
    emb = pa.FixedSizeListArray.from_arrays(pa.array(np.eye(3, 8, dtype=np.float32).ravel()), 8)
    pq.write_table(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "text": ["ice", "bread", "lava"], "emb": emb}),
                   root / "docs.parquet")
    return ["index", str(root / "docs.parquet"), "--out", str(root / "out"), "-q", "--vectors-column", "emb",
            "--index-factory", "Flat"]


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def index_run(root: Path, how: str, model: Path, *extra: str | Path) -> tuple[int, str]:
    """``petal index DOCS --out ROOT/out EXTRA`` over the shard of ``vector_index_argv``: a text run (the tests' fake
    engine) or ``--vectors-column``; (exit code, stderr)."""
    argv = vector_index_argv(root)
    env = None
    if how == "text":
        argv, env = [*argv[:5], "--model", str(model)], {"PETAL_TEST_FAKE_ENGINE": str(root / "fake.jsonl")}
    result = fake_invoke([*argv, *map(str, extra)], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stderr


@pytest.mark.parametrize("how", ["text", "vectors"])
def test_delete_file_that_is_not_there_or_not_a_file_is_no_input_naming_flag_and_path(tmp_path, fake_model, how):
    """``petal index --delete``: the rule of every input file, for text runs and --vectors-column, one line naming
    the flag and the file; the live version is left as it was (was: 66 "no such file" for a directory or a FIFO)."""
    assert index_run(tmp_path, how, fake_model)[0] == 0
    before = OutputDir(tmp_path / "out").current_version()
    for kind, path in bad_files(tmp_path, ".parquet").items():
        if kind == "empty":
            continue  # it opens: 0 bytes are not a Parquet file (65, below)
        code, stderr = index_run(tmp_path, how, fake_model, "--delete", path)
        assert code == 66, (kind, code, stderr)
        last = stderr.splitlines()[-1]
        assert f"--delete {path}" in last and SAID[kind] in last and "Traceback" not in stderr, (kind, stderr)
        assert OutputDir(tmp_path / "out").current_version() == before
    # the API reads the file the same way
    with pytest.raises(NoInputError, match=r"^delete .* is a directory"):
        petal.index([tmp_path / "docs.parquet"], tmp_path / "out", vectors_column="emb",
                    delete=tmp_path / "dir.parquet")


def test_a_delete_file_that_opens_but_is_not_ids_is_bad_input(tmp_path, fake_model):
    """Readable but malformed stays 65 naming the flag and the file: 0 bytes, not Parquet, no id column."""
    assert index_run(tmp_path, "vectors", fake_model)[0] == 0
    (tmp_path / "empty.parquet").write_bytes(b"")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    pq.write_table(pa.table({"x": [1], "y": [2]}), tmp_path / "columns.parquet")
    for name in ("empty.parquet", "junk.parquet", "columns.parquet"):
        code, stderr = index_run(tmp_path, "vectors", fake_model, "--delete", tmp_path / name)
        assert code == 65 and f"--delete {tmp_path / name}" in stderr.splitlines()[-1], (name, code, stderr)


def test_vector_file_contents_that_are_not_vectors_are_bad_input_not_usage(tmp_path, text_index):
    """A file that opens but holds no usable vectors is bad input data (65), like a corrupt --input (was: 2, 'usage
    error', for a junk file, a wrong shape or dtype, NaN, another dimension; a truncated .npy header was 1)."""
    cases = {"junk.npy": b"not an array", "truncated.npy": b"\x93NUMPY"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    np.save(tmp_path / "strings.npy", np.array(["a", "b"]))
    np.save(tmp_path / "nan.npy", np.full((1, 384), np.nan, np.float32))
    np.save(tmp_path / "dim.npy", np.ones((1, 5), np.float32))
    np.save(tmp_path / "cube.npy", np.ones((1, 2, 384), np.float32))
    for name in (*cases, "strings.npy", "nan.npy", "dim.npy", "cube.npy"):
        code, _, stderr = invoke("query", text_index, "--vector-file", tmp_path / name, "-k", "1")
        assert code == 65 and f"--vector-file {tmp_path / name}" in stderr, (name, code, stderr)
    np.save(tmp_path / "records.npy", np.zeros(2, dtype=[("a", "f4", (384,))]))  # a 1-D array of records
    code, _, stderr = invoke("query", text_index, "--vector-file", tmp_path / "records.npy", "-k", "1")
    assert code == 65 and "got (2,) [('a', '<f4', (384,))]" in stderr, stderr  # its shape as saved, not (1, 2)
    np.save(tmp_path / "rows0.npy", np.zeros((0, 384), np.float32))
    code, _, stderr = invoke("query", text_index, "--vector-file", tmp_path / "rows0.npy")
    assert code == 66 and "holds no vectors" in stderr
    np.save(tmp_path / "good.npy", np.ones((2, 384), np.float32))
    code, stdout, stderr = invoke("query", text_index, "--vector-file", tmp_path / "good.npy", "-k", "1", "--json")
    assert code == 0 and len(stdout.splitlines()) == 2, stderr


def test_no_query_to_answer_is_no_input_as_in_petal_embed(text_index):
    """Empty --stdin, --stdin of blank lines, blank TEXT only: 66 in both commands (was: petal query exited 0,
    petal embed 66); a run that answers one query is 0 whatever else was blank."""
    for args, stdin, said in [
        (["--stdin"], "", "nothing to query: --stdin is empty"),
        (["--stdin"], "\n  \n\t\n", "nothing to query: --stdin held only blank lines (3)"),
        ([" "], None, "nothing to query: the query TEXT is blank"),
        (["", " ", "--stdin"], "\n", "--stdin held only blank lines (1); all 2 query TEXTs are blank"),
    ]:
        code, stdout, stderr = invoke("query", text_index, *args, stdin=stdin)
        assert code == 66 and said in stderr and stdout == "", (args, code, stderr)
        embed_code, _, embed_stderr = invoke("embed", *args, stdin=stdin)
        assert embed_code == 66 and "nothing to embed" in embed_stderr, (args, embed_stderr)
    # a blank --stdin line or TEXT is answered in its place as skipped (those before the first answer, with it)
    for args, stdin, lines in [(["--stdin"], "\nglaciers\n\n", 3), ([" ", "glaciers"], None, 2),
                               (["glaciers", "--stdin"], "", 1)]:
        code, stdout, stderr = invoke("query", text_index, *args, "-k", "1", "--json", stdin=stdin)
        assert code == 0 and len(stdout.splitlines()) == lines, (args, stderr)
        embed_code, _, embed_stderr = invoke("embed", *args, stdin=stdin)
        assert embed_code == 0, (args, embed_stderr)


def test_help_states_the_empty_input_rule():
    for command in ("query", "embed"):
        code, stdout, _ = invoke(command, "--help")
        assert code == 0 and "exit 66" in " ".join(stdout.split()), command
