"""``petal embed --output`` naming the ``--input`` file, by any path, is a usage error (2) before the model loads,
the file left as it was. Was: ``--input t.jsonl --output t.jsonl`` embedded every text and then renamed the
vectors over the texts, exit 0 (and a hard or symbolic link to the input did the same under another name)."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from petal.cli.main import cli

TEXTS = "".join(json.dumps({"text": f"text number {i}"}) + "\n" for i in range(3))


@pytest.mark.parametrize("how", ["same path", "relative path", "hard link", "symbolic link"])
def test_an_output_that_is_the_input_is_2_and_the_input_is_untouched(tmp_path, monkeypatch, how):
    source = tmp_path / "texts.jsonl"
    source.write_text(TEXTS)
    monkeypatch.chdir(tmp_path)
    output = {"same path": source, "relative path": "./texts.jsonl", "hard link": tmp_path / "hard.jsonl",
              "symbolic link": tmp_path / "link.jsonl"}[how]
    if how == "hard link":
        os.link(source, output)
    if how == "symbolic link":
        os.symlink(source, output)
    # NOTE: a model that is not there: the output is judged before the model is looked for (else 78)
    result = CliRunner().invoke(cli, ["embed", "--input", str(source), "--output", str(output),
                                      "--model", str(tmp_path / "no-model")])
    assert result.exit_code == 2, result.output
    assert "is the --input file" in result.output and "Traceback" not in result.output
    assert source.read_text() == TEXTS


def test_another_output_beside_the_input_is_not_refused(tmp_path):
    source = tmp_path / "texts.jsonl"
    source.write_text(TEXTS)
    result = CliRunner().invoke(cli, ["embed", "--input", str(source), "--output", str(tmp_path / "vectors.jsonl"),
                                      "--model", str(tmp_path / "no-model")])
    assert result.exit_code == 78, result.output  # past the output's checks: the missing model
