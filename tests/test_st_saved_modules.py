"""Model directories as the installed sentence-transformers saves them (5+: ``1_Pooling/config.json`` says
``"pooling_mode": "mean"`` where older releases wrote ``pooling_mode_mean_tokens`` flags; Dense and Normalize say
where they read and write, ``module_input_name`` / ``module_output_name``, and a Dense may add its input,
``use_residual``). What petal applies embeds as sentence-transformers does (API and ``petal embed``); what it cannot
apply is refused naming the file and the key (ConfigError, exit 78), never ignored.

A random 2-layer BERT (``tiny_bert_dir``) under real sentence-transformers modules, saved by sentence-transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import petal
from petal.cli.main import cli
from tests.tiny_models import TEXTS


def st_save(path: Path, bert: Path, pooling: str | list[str], dense: dict | None = None,
            normalize: dict | None = None) -> Path:
    """``bert`` under Pooling, a Dense 64 -> 16 (tanh; ``dense``: its other arguments) and Normalize, saved by
    sentence-transformers to ``path``."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    torch.manual_seed(1)
    modules = [Transformer(str(bert)), Pooling(64, pooling),
               Dense(64, 16, activation_function=torch.nn.Tanh(), **(dense or {})), Normalize(**(normalize or {}))]
    SentenceTransformer(modules=modules, device="cpu").save(str(path))
    return path


def st_vectors(path: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu").encode(texts, convert_to_numpy=True)


@pytest.mark.parametrize("pooling", ["mean", "cls", "lasttoken", ["mean"]])
def test_a_model_saved_with_pooling_mode_embeds_as_sentence_transformers_does(tmp_path, tiny_bert_dir, pooling):
    path = st_save(tmp_path / "st", tiny_bert_dir, pooling)
    assert "pooling_mode" in json.loads((path / "1_Pooling" / "config.json").read_text())
    reference = st_vectors(path, TEXTS)
    with petal.Embedder(str(path), device="cpu") as embedder:
        np.testing.assert_allclose(embedder.encode(TEXTS), reference, atol=2e-5)
    result = CliRunner().invoke(cli, ["embed", *TEXTS, "--model", str(path), "--device", "cpu",
                                      "--output", str(tmp_path / "v.npy")])
    assert result.exit_code == 0, result.output
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), reference, atol=2e-5)


@pytest.mark.parametrize("pooling", ["max", "weightedmean", ["mean", "cls"]])
def test_a_pooling_mode_petal_does_not_run_is_refused_naming_it(tmp_path, tiny_bert_dir, pooling):
    path = st_save(tmp_path / "st", tiny_bert_dir, pooling)
    with pytest.raises(petal.ConfigError, match=r"1_Pooling/config.json asks for pooling_mode .*'cls', 'mean'"):
        petal.Embedder(str(path), device="cpu")


@pytest.mark.parametrize(("module", "arguments", "key"), [
    ("Dense", {"use_residual": True}, "use_residual is true"),
    ("Dense", {"module_output_name": "projected"}, "module_output_name 'projected'"),
    ("Dense", {"module_input_name": "token_embeddings", "module_output_name": "sentence_embedding"},
     "module_input_name 'token_embeddings'"),
    ("Normalize", {"module_output_name": "normalized"}, "module_output_name 'normalized'"),
])
def test_a_module_petal_cannot_apply_as_saved_is_refused_naming_the_key(tmp_path, tiny_bert_dir, module, arguments,
                                                                        key):
    """sentence-transformers applies these otherwise than to the pooled vector (a residual added; the output kept
    under another name, the embedding left as it was): petal refused none and applied a plain layer."""
    path = st_save(tmp_path / "st", tiny_bert_dir, "mean", **{module.lower(): arguments})
    # the Pooling flags of older releases, so only the module's keys are new here
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64,
                                                                "pooling_mode_mean_tokens": True}))
    folder = "2_Dense" if module == "Dense" else "3_Normalize"
    assert (path / folder / "config.json").is_file()
    with pytest.raises(petal.ConfigError, match=f"{folder}/config.json: .*{key}"):
        petal.Embedder(str(path), device="cpu")
    result = CliRunner().invoke(cli, ["embed", "a text", "--model", str(path), "--device", "cpu"])
    assert result.exit_code == 78, result.output
    assert key in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("safe", [True, False])
def test_a_dense_bias_its_config_does_not_take_is_refused_not_dropped(tmp_path, tiny_bert_dir, safe):
    """2_Dense/config.json says bias false over weights that hold linear.bias (sentence-transformers' strict load
    refuses it): petal dropped the bias and embedded otherwise. Safetensors and pickle weights alike."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    path = tmp_path / "st"
    modules = [Transformer(str(tiny_bert_dir)), Pooling(64, "mean"), Dense(64, 16), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(path), safe_serialization=safe)
    config = json.loads((path / "2_Dense" / "config.json").read_text())
    (path / "2_Dense" / "config.json").write_text(json.dumps({**config, "bias": False}))
    with pytest.raises(RuntimeError, match=r"linear\.bias"):
        st_vectors(path, TEXTS)
    with pytest.raises(petal.ConfigError, match=r"2_Dense/(model.safetensors|pytorch_model.bin): tensors the layer "
                                                r"would not read: linear.bias"):
        petal.Embedder(str(path), device="cpu", allow_pickle_weights=not safe).encode(TEXTS)


def test_a_transformer_in_a_sub_folder_is_refused_with_the_move_that_keeps_its_modules(tmp_path, tiny_bert_dir):
    """An older sentence-transformers layout (the transformer's files in 0_Transformer/, modules.json beside it, here
    with cls pooling and a Dense): petal said '... has no config.json; is it a Hugging Face model directory?' (and,
    with a config.json above too, 'pass --model .../0_Transformer', which embeds without this modules.json: mean
    pooling, no Dense, other vectors). It now says to move the files up; done, petal embeds as sentence-transformers
    embeds the original."""
    import shutil

    path = st_save(tmp_path / "st", tiny_bert_dir, "cls")
    sub = path / "0_Transformer"
    sub.mkdir()
    kept = ("modules.json", "config_sentence_transformers.json")
    top = [f for f in path.iterdir() if f.is_file() and f.name not in kept]
    for f in top:
        shutil.move(f, sub / f.name)
    modules = json.loads((path / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (path / "modules.json").write_text(json.dumps(modules))
    reference = st_vectors(path, TEXTS)
    with pytest.raises(petal.ConfigError, match=r"keeps the transformer in .*0_Transformer; .* move the files of "):
        petal.Embedder(str(path), device="cpu")
    with petal.Embedder(str(sub), device="cpu") as what_was_advised:
        assert what_was_advised.encode(TEXTS).shape == (len(TEXTS), 64)  # no Dense: not the model's 16 dims
    for f in top:
        shutil.move(sub / f.name, path / f.name)
    modules[0]["path"] = ""
    (path / "modules.json").write_text(json.dumps(modules))
    with petal.Embedder(str(path), device="cpu") as embedder:
        np.testing.assert_allclose(embedder.encode(TEXTS), reference, atol=2e-5)


@pytest.mark.parametrize(("change", "key"), [
    ({"transformer_task": "fill-mask"}, "transformer_task 'fill-mask'"),
    ({"modality_config": {"text": {"method": "forward", "method_output_name": "pooler_output"}}},
     "modality_config.text.method_output_name 'pooler_output'"),
    ({"module_output_name": "sentence_embedding"}, "module_output_name 'sentence_embedding'"),
])
def test_a_transformer_that_gives_other_token_embeddings_is_refused_naming_the_key(tmp_path, tiny_bert_dir, change,
                                                                                  key):
    """sentence-transformers 5+'s sentence_bert_config.json says what the Transformer module outputs (a masked LM's
    logits, the pooler's output, written straight as the sentence embedding); petal ignored it and pooled the last
    hidden states."""
    path = st_save(tmp_path / "st", tiny_bert_dir, "mean")
    config = json.loads((path / "sentence_bert_config.json").read_text())
    assert config["transformer_task"] == "feature-extraction"  # as saved: runs (the tests above)
    (path / "sentence_bert_config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(petal.ConfigError, match=f"sentence_bert_config.json: {key}; petal runs the transformer"):
        petal.Embedder(str(path), device="cpu")
