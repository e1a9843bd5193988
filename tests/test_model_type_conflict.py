"""config.json whose ``architectures`` and ``model_type`` name different families (``["BertModel"]`` with
``"roberta"``): transformers' AutoModel builds the model_type's model (RoBERTa: positions from pad_token_id + 1),
petal took the architecture (BERT) and embedded otherwise at exit 0. Refused 78 naming config.json and both names;
names of one computation (XLMRobertaModel with roberta, Qwen3ForCausalLM with qwen3) still load. Real MiniLM files."""

from __future__ import annotations

import pytest

import petal
from petal.engine.errors import ModelError
from petal.engine.loader import inspect_model
from petal.engine.models import family_for
from tests.test_model_dir_audit import copy_model, edit_json


def minilm_typed(minilm_dir, tmp_path, model_type):
    path = copy_model(minilm_dir, tmp_path / "minilm")
    edit_json(path / "config.json", lambda config: config.update(model_type=model_type))
    return path


def test_automodel_builds_the_model_type_not_the_architecture(minilm_dir, tmp_path):
    from transformers import AutoConfig, AutoModel

    path = minilm_typed(minilm_dir, tmp_path, "roberta")
    assert type(AutoModel.from_config(AutoConfig.from_pretrained(str(path)))).__name__ == "RobertaModel"


def test_a_bert_architecture_with_a_roberta_model_type_is_refused(minilm_dir, tmp_path):
    path = minilm_typed(minilm_dir, tmp_path, "roberta")
    with pytest.raises(ModelError) as info:
        inspect_model(path)
    assert f"{path / 'config.json'}: architectures names 'BertModel' (bert) but model_type is 'roberta'" \
        in str(info.value)
    with pytest.raises(petal.ConfigError) as api:
        petal.Embedder(str(path), "cpu").encode(["glaciers move"])
    assert api.value.exit_code == 78


def test_the_cli_exits_78_naming_the_conflict(minilm_dir, tmp_path):
    from tests import forkrun

    path = minilm_typed(minilm_dir, tmp_path, "qwen3")
    result = forkrun.petal(["embed", "--device", "cpu", "--model", str(path), "glaciers move"], timeout=300)
    assert result.rc == 78, result.stderr
    assert "model_type is 'qwen3'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("architecture,model_type", [("XLMRobertaModel", "roberta"), ("RobertaModel", "xlm-roberta"),
                                                     ("Qwen3ForCausalLM", "qwen3"), ("BertModel", "bert"),
                                                     ("BertModel", "unknown-type")])
def test_names_of_one_computation_agree(architecture, model_type):
    assert family_for({"architectures": [architecture], "model_type": model_type}) is not None
