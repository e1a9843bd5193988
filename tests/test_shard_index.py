"""A checkpoint index (``model.safetensors.index.json``) is read as transformers reads it: its shard names stay in
the model directory (78 naming the entry otherwise), ``model.safetensors`` beside it wins (transformers' order),
and a tensor two shards hold is the one its ``weight_map`` names. Real safetensors files of a tiny random BERT
saved by transformers, its real word-level tokenizer, transformers for the reference weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import petal
from tests.tiny_models import TEXTS, make_model

WORD = "embeddings.word_embeddings.weight"


def embed(model: Path) -> np.ndarray:
    return np.asarray(petal.Embedder(str(model), "cpu").encode(TEXTS[:3]))


def shard(model: Path, shards: dict[str, dict[str, torch.Tensor]], weight_map: dict[str, str]) -> None:
    """``model``'s weights replaced by ``shards`` (file name -> tensors) and an index of ``weight_map``."""
    (model / "model.safetensors").unlink(missing_ok=True)
    for name, tensors in shards.items():
        save_file(tensors, str(model / name), metadata={"format": "pt"})
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.fixture
def bert(tmp_path: Path) -> Path:
    make_model("bert", tmp_path / "bert")
    return tmp_path / "bert"


@pytest.mark.parametrize("where", ["../elsewhere/model.safetensors", "absolute",
                                   "sub/../../elsewhere/model.safetensors"])
def test_an_index_naming_a_shard_outside_the_model_directory_is_refused(bert, tmp_path, where):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    tensors = load_file(str(bert / "model.safetensors"))
    save_file(tensors, str(elsewhere / "model.safetensors"), metadata={"format": "pt"})
    model = tmp_path / "m"
    shutil.copytree(bert, model)
    name = str(elsewhere / "model.safetensors") if where == "absolute" else where
    shard(model, {}, {key: name for key in tensors})
    with pytest.raises(petal.ConfigError) as info:
        embed(model)
    assert info.value.exit_code == 78
    assert "outside the model directory" in str(info.value) and name in str(info.value), str(info.value)


def test_a_shard_in_a_subfolder_or_a_link_inside_the_directory_still_loads(bert, tmp_path):
    tensors = load_file(str(bert / "model.safetensors"))
    expected = embed(bert)
    model = tmp_path / "m"
    shutil.copytree(bert, model)
    (model / "sub").mkdir()
    shard(model, {"sub/a.safetensors": tensors}, {key: "sub/a.safetensors" for key in tensors})
    np.testing.assert_allclose(embed(model), expected, atol=1e-6)
    (model / "b.safetensors").symlink_to(model / "sub" / "a.safetensors")  # a link: the user's choice
    shard(model, {}, {key: "b.safetensors" for key in tensors})
    np.testing.assert_allclose(embed(model), expected, atol=1e-6)


def test_model_safetensors_beside_an_index_wins_as_in_transformers(bert, tmp_path):
    import transformers

    expected = embed(bert)
    other = tmp_path / "other"
    make_model("bert", other, seed=7)
    tensors = load_file(str(other / "model.safetensors"))
    one = "model-00001-of-00001.safetensors"
    shard(other, {one: tensors}, dict.fromkeys(tensors, one))
    shutil.copy(bert / "model.safetensors", other / "model.safetensors")  # both now: the single file and the index
    got = embed(other)
    np.testing.assert_allclose(got, expected, atol=1e-6)
    reference = transformers.AutoModel.from_pretrained(str(other)).state_dict()
    for key, tensor in load_file(str(bert / "model.safetensors")).items():
        assert torch.equal(reference[key], tensor), key  # transformers loaded the single file too


def test_a_tensor_two_shards_hold_is_the_one_the_weight_map_names(bert, tmp_path):
    import transformers

    expected = embed(bert)
    tensors = load_file(str(bert / "model.safetensors"))
    stale = dict(tensors, **{WORD: torch.randn_like(tensors[WORD])})  # the first shard's copy is another tensor
    model = tmp_path / "m"
    shutil.copytree(bert, model)
    weight_map = dict.fromkeys(tensors, "model-00001-of-00002.safetensors") | {WORD: "model-00002-of-00002.safetensors"}
    shard(model, {"model-00001-of-00002.safetensors": stale, "model-00002-of-00002.safetensors": {WORD: tensors[WORD]}},
          weight_map)
    np.testing.assert_allclose(embed(model), expected, atol=1e-6)
    reference = transformers.AutoModel.from_pretrained(str(model)).state_dict()
    assert torch.equal(reference[WORD], tensors[WORD])  # transformers follows the weight_map too


def test_a_tensor_two_pickle_shards_hold_is_the_one_the_weight_map_names(bert, tmp_path):
    expected = embed(bert)
    tensors = load_file(str(bert / "model.safetensors"))
    model = tmp_path / "m"
    shutil.copytree(bert, model)
    (model / "model.safetensors").unlink()
    stale = dict(tensors, **{WORD: torch.randn_like(tensors[WORD])})
    first, second = "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"
    torch.save(tensors, model / first)
    norm = "embeddings.LayerNorm.weight"
    torch.save({WORD: stale[WORD], norm: tensors[norm]}, model / second)  # its stale copy overwrote the first's
    (model / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": dict.fromkeys(tensors, first) | {norm: second}}))
    got = np.asarray(petal.Embedder(str(model), "cpu", allow_pickle_weights=True).encode(TEXTS[:3]))
    np.testing.assert_allclose(got, expected, atol=1e-6)
