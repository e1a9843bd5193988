"""``petal embed --output`` and ``--input`` judge a file's format by how its name ends (README: "a name that does not
end in .npy or .jsonl is a usage error"): a name that is the suffix alone (``.npy``, ``dir/.jsonl``, ``dir/.txt``) is
that format. Before, ``Path('.npy').suffix`` is ``''``: ``petal embed hello --output .npy`` was refused "expected a
.npy or .jsonl file" (2), and ``--input dir/.txt`` "expected a .parquet, .txt or .jsonl file". (``petal query
--vector-file`` and ``--json-report`` take any name: no suffix rule.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli


def test_name_suffix_is_how_the_name_ends():
    from petal.pipeline.reliability.safe_files import name_suffix

    assert [name_suffix(p) for p in (".npy", "dir/.jsonl", "a.tar.NPY", Path("x.parquet"), "plain", "x.", "d.d/x")] \
        == [".npy", ".jsonl", ".npy", ".parquet", "", ".", ""]


def embed(minilm_dir: Path, *args: str):
    return CliRunner().invoke(cli, ["embed", "--model", str(minilm_dir), "--device", "cpu", *args])


def test_an_output_named_by_its_suffix_alone(tmp_path: Path, minilm_dir: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    done = embed(minilm_dir, "hello", "world", "--output", ".npy")
    assert done.exit_code == 0, done.output
    assert np.load(tmp_path / ".npy").shape == (2, 384)
    (tmp_path / "d").mkdir()
    done = embed(minilm_dir, "hello", "--output", "d/.jsonl")
    assert done.exit_code == 0, done.output
    assert json.loads((tmp_path / "d" / ".jsonl").read_text())["index"] == 0
    ids = embed(minilm_dir, "--input", "d/.jsonl", "--id-column", "index", "--output", "d/.npy")
    assert ids.exit_code == 2 and "holds the rows only" in ids.output, ids.output  # the .npy rule, by name
    for wrong in ("d/x.", "d/npy", str(tmp_path)):
        refused = embed(minilm_dir, "hello", "--output", wrong)
        assert refused.exit_code == 2 and "expected a .npy or .jsonl file" in refused.output, (wrong, refused.output)


def test_an_input_named_by_its_suffix_alone(tmp_path: Path, minilm_dir: Path):
    (tmp_path / ".txt").write_text("glaciers\nespresso\n")
    (tmp_path / ".jsonl").write_text('{"text": "glaciers", "id": 7}\n{"text": "espresso", "id": 8}\n')
    pq.write_table(pa.table({"text": ["glaciers", "espresso"], "id": [7, 8]}), tmp_path / ".parquet")
    expected = np.asarray(json.loads(embed(minilm_dir, "glaciers").stdout)["embedding"])
    for name, extra in ((".txt", []), (".jsonl", ["--id-column", "id"]), (".parquet", ["--id-column", "id"])):
        done = embed(minilm_dir, "--input", str(tmp_path / name), *extra)
        assert done.exit_code == 0, (name, done.output)
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert len(lines) == 2, name
        np.testing.assert_allclose(lines[0]["embedding"], expected, rtol=0, atol=1e-6)  # batched with another
        assert [line.get("id") for line in lines] == ([None, None] if name == ".txt" else [7, 8])
    text_column = embed(minilm_dir, "--input", str(tmp_path / ".txt"), "--text-column", "body")
    assert text_column.exit_code == 2 and "--text-column goes with" in text_column.output  # .txt's rule, by name
