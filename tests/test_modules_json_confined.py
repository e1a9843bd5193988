"""modules.json: a module ``type`` outside sentence-transformers (``mypkg.Normalize``) was taken for
sentence-transformers' class of the same last name, and a module ``path`` leading outside the model directory
(``../other/1_Pooling``, an absolute path) read another directory's configuration, both at exit 0. Refused 78 naming
modules.json and the type or path; pplx-embed's ``st_quantize.FlexibleQuantizer`` (README) still loads. Real
MiniLM files."""

from __future__ import annotations

import json
import shutil

import pytest

import petal
from petal.engine.errors import ModelError
from petal.engine.loader import inspect_model
from tests.test_model_dir_audit import copy_model


def minilm_modules(minilm_dir, tmp_path, change):
    path = copy_model(minilm_dir, tmp_path / "minilm")
    modules = json.loads((path / "modules.json").read_text())
    change(path, modules)
    (path / "modules.json").write_text(json.dumps(modules))
    return path


def foreign_normalize(path, modules):
    modules[2]["type"] = "mypkg.Normalize"


def pooling_outside(path, modules):
    other = path.parent / "other"
    shutil.copytree(path / "1_Pooling", other / "1_Pooling")
    modules[1]["path"] = "../other/1_Pooling"


def pooling_absolute(path, modules):
    other = path.parent / "other"
    shutil.copytree(path / "1_Pooling", other / "1_Pooling")
    modules[1]["path"] = str(other / "1_Pooling")


@pytest.mark.parametrize("change,said", [(foreign_normalize, "module type 'mypkg.Normalize'"),
                                         (pooling_outside, "module path '../other/1_Pooling' leads outside"),
                                         (pooling_absolute, "leads outside the model directory")])
def test_a_foreign_module_type_or_a_path_outside_is_refused(minilm_dir, tmp_path, change, said):
    path = minilm_modules(minilm_dir, tmp_path, change)
    with pytest.raises(ModelError) as info:
        inspect_model(path)
    message = str(info.value)
    assert message.startswith(f"{path / 'modules.json'}: module ") and said in message, message


def test_the_cli_exits_78_for_a_foreign_module_type(minilm_dir, tmp_path):
    from tests import forkrun

    path = minilm_modules(minilm_dir, tmp_path, foreign_normalize)
    result = forkrun.petal(["embed", "--device", "cpu", "--model", str(path), "glaciers move"], timeout=300)
    assert result.rc == 78, result.stderr
    assert "mypkg.Normalize" in result.stderr and "Traceback" not in result.stderr


def test_sentence_transformers_types_and_the_pplx_quantizer_load(minilm_dir, tmp_path):
    def quantizer(path, modules):
        modules.append({"idx": 3, "name": "3", "path": "", "type": "st_quantize.FlexibleQuantizer"})

    assert inspect_model(minilm_modules(minilm_dir, tmp_path, quantizer)).int8_scheme == "tanh"
    assert petal.Embedder(str(minilm_dir), "cpu").encode(["glaciers move"]) is not None
