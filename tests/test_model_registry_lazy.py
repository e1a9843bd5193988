"""The model registry and the config reading are torch-free (engine/models/families.py): a model directory is
judged without torch; each family's nn.Module class, imported only to build a model, refers back to it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

INSPECT = """
import json, sys
from petal.engine.loader import inspect_model
from petal.engine.models import family_for
spec = inspect_model(None)
try:
    family_for({"architectures": ["GPT2Model"], "model_type": "gpt2"})
except ValueError as exc:
    refused = str(exc)
print(json.dumps({"architecture": spec.config.architecture, "dim": spec.dim, "refused": refused,
                  "torch": "torch" in sys.modules}))
"""


def test_inspecting_a_model_directory_imports_no_torch():
    proc = subprocess.run([sys.executable, "-c", INSPECT], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout)
    assert found["architecture"] == "bert" and found["dim"] == 384
    assert found["refused"].startswith("unsupported model architecture ('GPT2Model', 'gpt2' in config.json); "
                                       "supported: BertModel, PPLXQwen3Model")
    assert not found["torch"], "inspect_model imported torch"


def test_each_family_builds_its_own_class_and_the_class_reads_its_config_through_it():
    from petal.engine.models import MODEL_REGISTRY, model_class_for

    for name, family in MODEL_REGISTRY.items():
        cls = model_class_for({"architectures": [name]})
        assert cls.family is family, name
        assert cls.__name__ == family.model_class_name
        # load_model finds the class again by the architecture the family's config names
        assert model_class_for({"model_type": family.architecture}) is cls


@pytest.mark.parametrize("name", ["gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish"])
def test_every_activation_config_json_may_name_runs(name):
    import torch

    from petal.engine.layers.activation import get_activation
    from petal.engine.models.families import bert_config

    hf = {"num_attention_heads": 2, "hidden_size": 4, "num_hidden_layers": 1, "vocab_size": 8,
          "intermediate_size": 8, "max_position_embeddings": 16, "hidden_act": name}
    assert bert_config(hf).hidden_act == name
    assert get_activation(name)(torch.ones(2)).shape == (2,)


def test_an_unknown_activation_is_refused_with_the_known_ones():
    from petal.engine.layers.activation import get_activation
    from petal.engine.models.families import bert_config

    hf = {"num_attention_heads": 2, "hidden_size": 4, "num_hidden_layers": 1, "vocab_size": 8,
          "intermediate_size": 8, "max_position_embeddings": 16, "hidden_act": "mish"}
    message = "activation 'mish' is not supported; known: gelu, gelu_fast, gelu_new, gelu_pytorch_tanh, relu, silu"
    with pytest.raises(ValueError, match=message):
        bert_config(hf)
    with pytest.raises(ValueError, match=message):
        get_activation("mish")
