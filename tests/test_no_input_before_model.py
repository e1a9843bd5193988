"""No input (66) outranks what loading the model would say (a missing ``--model``: 78; a model whose weights are
gone: 78), in every ordering of petal embed's inputs, as petal index judges its sources and petal query its TEXT
before the model. ``petal embed --stdin`` alone streams (the model loads before the first line arrives, so a
coprocess's first answer does not wait for it): an empty or blank-only stdin there was 78 with a bad model where the
same stdin read whole (``--output``) was 66; a blank TEXT, or ``--input`` of blank lines only, was 78 too. A text to
embed with the bad model is still 78."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO


def petal(args: list[str], cwd: Path, stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *args], cwd=cwd, env=env, input=stdin,
                          capture_output=True, timeout=600)


@pytest.fixture(scope="module", params=["missing", "weightless"])
def bad_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    """A --model that is not there, or one whose configuration and tokenizer read but whose weights are gone."""
    root = tmp_path_factory.mktemp("bad-model")
    if request.param == "missing":
        return root / "no-such-model"
    model = root / "model"
    shutil.copytree(minilm_dir, model)
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:8 + struct.unpack("<Q", data[:8])[0]])
    return model


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inputs")
    (root / "blank.txt").write_text("\n  \n\t\n")
    (root / "blank.jsonl").write_text('{"text": " "}\n{"text": null}\n')
    pq.write_table(pa.table({"id": [1, 2], "text": [None, "  "]}), root / "blank.parquet")
    (root / "empty").mkdir()
    return root


STDIN_CASES = {
    "empty stdin": ([], b""),
    "blank stdin": ([], b"\n \n\t\n"),
    "stdin not UTF-8 or blank": ([], b"\xff\xfe\n\n"),
    "empty stdin --query": (["--query"], b""),
    "blank stdin --dim 8": (["--dim", "8"], b"\n\n"),
    "blank stdin read whole (--output)": (["--output", "OUT.npy"], b"\n \n"),
    "blank stdin --quantize int8": (["--quantize", "int8"], b" \n"),
    "blank stdin beside a blank TEXT": ([" "], b"\n"),
}


@pytest.mark.parametrize("case", list(STDIN_CASES))
def test_embed_stdin_without_a_text_is_66_whatever_the_model(tmp_path, bad_model, case):
    flags, stdin = STDIN_CASES[case]
    flags = [str(tmp_path / f) if f == "OUT.npy" else f for f in flags]
    proc = petal(["embed", "--stdin", "--model", str(bad_model), *flags], tmp_path, stdin)
    assert proc.returncode == 66, proc.stderr.decode()[-2000:]  # was: 78 for the streamed ones
    assert b"nothing to embed" in proc.stderr
    assert proc.stdout == b""
    assert not (tmp_path / "OUT.npy").exists()


@pytest.mark.parametrize("flags", [[""], [" ", "\t"], ["--input", "blank.txt"], ["--input", "blank.jsonl"],
                                   ["--input", "blank.parquet"], ["--input", "blank.parquet", "--id-column", "id"],
                                   ["", "--quantize", "int8"], ["", "--quantize", "binary", "--dim", "16"]],
                         ids=["blank TEXT", "two blank TEXT", "blank .txt", "blank .jsonl", "null .parquet",
                              "null .parquet with ids", "blank TEXT int8", "blank TEXT binary"])
def test_embed_texts_or_input_without_a_text_is_66_whatever_the_model(tmp_path, bad_model, inputs, flags):
    flags = [str(inputs / f) if f.startswith("blank.") else f for f in flags]
    proc = petal(["embed", "--model", str(bad_model), *flags], tmp_path)
    assert proc.returncode == 66, proc.stderr.decode()[-2000:]  # was: 78
    assert b"nothing to embed" in proc.stderr and b"skipped" in proc.stderr


@pytest.mark.parametrize("args, stdin", [(["--stdin"], b"\n\nglaciers\n"), (["--stdin"], b"glaciers"),
                                         (["--stdin", "--output", "x.npy"], b"\nglaciers\n"), (["glaciers", " "], b"")],
                         ids=["streamed", "streamed without a line end", "read whole", "TEXT"])
def test_a_text_to_embed_with_a_bad_model_is_still_78(tmp_path, bad_model, args, stdin):
    proc = petal(["embed", "--model", str(bad_model), *args], tmp_path, stdin)
    assert proc.returncode == 78, proc.stderr.decode()[-2000:]
    assert proc.stdout == b""


def test_a_streamed_stdin_with_a_good_model_still_says_66_for_blank_lines(tmp_path):
    proc = petal(["embed", "--stdin"], tmp_path, b"\n \n")
    assert proc.returncode == 66, proc.stderr.decode()[-2000:]
    assert b"2 skipped (empty_text 2" in proc.stderr


def test_index_and_query_text_rank_no_input_first_too(tmp_path, bad_model, inputs):
    """The orderings petal index and petal query TEXT already had, pinned beside embed's."""
    proc = petal(["index", str(inputs / "empty"), "--out", str(tmp_path / "o"), "--model", str(bad_model)], tmp_path)
    assert proc.returncode == 66, proc.stderr.decode()[-2000:]
    shard = tmp_path / "s.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["glaciers melt", "bread rises", "tides turn"]}), shard)
    built = petal(["index", str(shard), "--out", str(tmp_path / "idx"), "-q"], tmp_path)
    assert built.returncode == 0, built.stderr.decode()[-2000:]
    proc = petal(["query", str(tmp_path / "idx"), " ", "--model", str(bad_model)], tmp_path)
    assert proc.returncode == 66, proc.stderr.decode()[-2000:]


@pytest.mark.parametrize("stdin", [b"", b"\n \n"], ids=["empty", "blank"])
def test_query_stdin_without_a_query_is_66_whatever_the_model(tmp_path, bad_model, stdin):
    shard = tmp_path / "s.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["glaciers melt", "bread rises", "tides turn"]}), shard)
    built = petal(["index", str(shard), "--out", str(tmp_path / "idx"), "-q"], tmp_path)
    assert built.returncode == 0, built.stderr.decode()[-2000:]
    proc = petal(["query", str(tmp_path / "idx"), "--stdin", "--model", str(bad_model)], tmp_path, stdin)
    assert proc.returncode == 66, proc.stderr.decode()[-2000:]


def test_query_stdin_with_a_query_after_blank_lines_still_names_the_model(tmp_path, bad_model):
    """The held model error stands once a query arrives: 78, nothing written."""
    shard = tmp_path / "s.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["glaciers melt", "bread rises", "tides turn"]}), shard)
    built = petal(["index", str(shard), "--out", str(tmp_path / "idx"), "-q"], tmp_path)
    assert built.returncode == 0, built.stderr.decode()[-2000:]
    proc = petal(["query", str(tmp_path / "idx"), "--stdin", "--model", str(bad_model)], tmp_path,
                 b"\n  \nglaciers\n")
    assert proc.returncode == 78, proc.stderr.decode()[-2000:]
    assert proc.stdout == b""
