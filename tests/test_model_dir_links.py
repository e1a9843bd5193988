"""A model directory (or a module folder inside it) that is a symbolic link loop is refused naming it (78), never a
bare ``RuntimeError`` from ``Path.resolve()`` (a traceback, exit 1); a model directory petal may not enter is named
itself (66), not the first file inside it petal tried to read.

Real files: the packaged MiniLM (its weights linked), real ``petal embed`` processes, real ``Embedder``s.
"""

from __future__ import annotations

import shutil

import pytest

import petal
from tests.test_input_files import run_unprivileged
from tests.test_model_dir_audit import copy_model, petal_embed


@pytest.mark.parametrize("shape", ["two links", "one link to itself", "a path below a loop"])
def test_a_model_path_that_is_a_link_loop_is_refused_naming_it(tmp_path, shape):
    loop = tmp_path / "loopA"
    if shape == "two links":
        loop.symlink_to(tmp_path / "loopB")
        (tmp_path / "loopB").symlink_to(loop)
    else:
        loop.symlink_to(loop)
    if shape == "a path below a loop":
        loop = loop / "sub"
    result = petal_embed("hello", "--model", str(loop))
    assert result.rc == 78, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert f"model {str(loop)!r} leads into a symbolic link loop" in result.last_line
    with pytest.raises(petal.ConfigError, match="symbolic link loop"):
        petal.Embedder(str(loop), "cpu")


@pytest.mark.parametrize("folder", ["1_Pooling", "2_Normalize"])
def test_a_module_folder_that_is_a_link_loop_is_refused_naming_it(minilm_dir, tmp_path, folder):
    model = copy_model(minilm_dir, tmp_path / "model")
    shutil.rmtree(model / folder, ignore_errors=True)
    (model / folder).symlink_to(folder)
    result = petal_embed("hello", "--model", str(model))
    assert result.rc == 78, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert f"module path {folder!r} ({model / folder}) is a symbolic link loop" in result.last_line
    with pytest.raises(petal.ConfigError, match=f"{folder}.*symbolic link loop"):
        petal.Embedder(str(model), "cpu")


def test_a_model_directory_petal_may_not_enter_is_named_itself(minilm_dir, tmp_path):
    model = copy_model(minilm_dir, tmp_path / "model")
    model.chmod(0o600)  # readable, not searchable: no file inside can be opened
    try:
        proc = run_unprivileged(["embed", "hello", "--device", "cpu", "--model", "model"], tmp_path)
    finally:
        model.chmod(0o755)
    assert proc.returncode == 66, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("petal: error: model: petal may not read it (permission denied)"), line
    assert "config.json" not in line
