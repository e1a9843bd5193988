"""``petal embed --quantize int8`` without ``--calibration`` learns its ranges from the texts embedded: fewer than 2
texts to embed (one TEXT; one beside a blank one) is a usage error (2) said before the model's weights load, not
after the model loaded and embedded the one text. The model here has its configuration and tokenizer but no
tensors (the header of its model.safetensors only): a run that loads it is 78, so 2 shows the flags were judged
first. Two texts are still embedded, and a model's own int8 scheme or --calibration is not affected."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def weightless(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    model = tmp_path_factory.mktemp("weightless") / "model"
    shutil.copytree(minilm_dir, model)
    weights = model / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:8 + struct.unpack("<Q", data[:8])[0]])
    return model


def petal(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("texts", [["glaciers"], ["glaciers", " "]], ids=["one text", "one beside a blank"])
def test_int8_ranges_from_one_text_is_2_before_the_model_loads(tmp_path, weightless, texts):
    proc = petal(["embed", "--model", str(weightless), "--quantize", "int8", *texts], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]  # was: 78, the model's weights judged first
    assert "needs at least 2 different ones, got 1:" in proc.stderr
    assert "--calibration INDEX" in proc.stderr


@pytest.mark.parametrize("texts", [["glaciers", "glaciers"], ["glaciers", " ", "glaciers", "glaciers"]],
                         ids=["one text twice", "three copies and a blank"])
def test_int8_ranges_from_copies_of_one_text_is_2_before_the_model_loads(tmp_path, weightless, texts):
    """Was: embedded, every code of every row -128 (each dimension's range 0), exit 0: no ranges were learned."""
    proc = petal(["embed", "--model", str(weightless), "--quantize", "int8", *texts], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"got {texts.count('glaciers')} copies of one text" in proc.stderr


def test_int8_ranges_from_texts_the_model_embeds_alike_is_2(tmp_path, minilm_dir):
    """Two texts MiniLM does not tell apart (it lower-cases): one vector twice, no range: 2, not all -128 codes."""
    proc = petal(["embed", "--model", str(minilm_dir), "--quantize", "int8", "Glaciers", "glaciers"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "needs at least 2 different vectors; these 2 are one and the same" in proc.stderr
    assert proc.stdout == ""


def test_the_weightless_model_is_78_once_the_flags_pass(tmp_path, weightless):
    assert petal(["embed", "--model", str(weightless), "--quantize", "int8", "a", "b"], tmp_path).returncode == 78


def test_two_texts_are_embedded_as_int8(tmp_path, minilm_dir):
    proc = petal(["embed", "--model", str(minilm_dir), "--quantize", "int8", "glaciers", "bread"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout.splitlines()) == 2
