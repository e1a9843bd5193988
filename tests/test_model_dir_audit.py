"""A model directory petal cannot use is refused by name (ConfigError, exit 78), never a traceback, a silently
truncated value or a silently dropped part of the checkpoint; a --max-length above the model's limit is a usage
error (2) like --dim above its width; Embedder keywords of the wrong type are UsageErrors.

Real files throughout: the packaged MiniLM (its weights linked, its JSON files edited), tiny checkpoints saved by
transformers, real torch pickles, real `petal embed` processes.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import petal
from tests import forkrun
from tests.tiny_models import make_model


def copy_model(src: Path, dst: Path) -> Path:
    """``src``'s files, weights linked (not copied), JSON files copied so they can be edited."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_dir():
            shutil.copytree(f, dst / f.name)
        elif f.suffix == ".safetensors":
            os.symlink(f, dst / f.name)
        else:
            shutil.copy(f, dst / f.name)
    return dst


def edit_json(path: Path, change: Callable[[dict], object]) -> None:
    value = json.loads(path.read_text())
    change(value)
    path.write_text(json.dumps(value))


def petal_embed(*args: str) -> forkrun.Result:
    """``petal embed`` in its own process, forked from the preloaded forkserver."""
    return forkrun.petal(["embed", "--device", "cpu", *args], timeout=300)


def refused(model: Path, *names: str, **settings: object) -> str:
    """The ConfigError message of loading ``model`` and embedding one text; it must name each of ``names``."""
    with pytest.raises(petal.ConfigError) as info:
        petal.Embedder(str(model), "cpu", **settings).encode(["glaciers move"])
    assert info.value.exit_code == 78
    message = str(info.value)
    for name in names:
        assert name in message, message
    return message


CONFIG_VALUES = {
    "hidden_size null": (lambda c: c.update(hidden_size=None), "hidden_size is null"),
    "hidden_size a list": (lambda c: c.update(hidden_size=[384]), "hidden_size [384]"),
    "hidden_size 384.5": (lambda c: c.update(hidden_size=384.5), "hidden_size 384.5"),  # was truncated to 384
    "hidden_size a string": (lambda c: c.update(hidden_size="384"), "hidden_size '384'"),
    "no heads": (lambda c: c.update(num_attention_heads=0), "num_attention_heads 0"),  # was ZeroDivisionError
    "heads not dividing": (lambda c: c.update(num_attention_heads=7), "not a multiple of num_attention_heads 7"),
    "activation": (lambda c: c.update(hidden_act="swishy"), "'swishy'"),  # was a UsageError (2) at build time
    "one position": (lambda c: c.update(max_position_embeddings=1), "max_position_embeddings 1"),
    "architectures a string": (lambda c: c.update(architectures="BertModel"), "architectures 'BertModel'"),
    "architectures of objects": (lambda c: c.update(architectures=[{"a": 1}]), "architectures"),
    "layer_norm_eps a string": (lambda c: c.update(layer_norm_eps="x"), "layer_norm_eps 'x'"),
}


@pytest.mark.parametrize("case", list(CONFIG_VALUES))
def test_config_json_values_of_the_wrong_kind_are_refused_naming_the_key(minilm_dir, tmp_path, case):
    change, said = CONFIG_VALUES[case]
    model = copy_model(minilm_dir, tmp_path / "m")
    edit_json(model / "config.json", change)
    refused(model, str(model / "config.json"), said)


@pytest.mark.parametrize("content", [b"[1, 2]", b"\xff\xfe{}"])
def test_a_config_json_that_is_no_object_is_refused(minilm_dir, tmp_path, content):
    model = copy_model(minilm_dir, tmp_path / "m")
    (model / "config.json").write_bytes(content)
    refused(model, str(model / "config.json"))


ST_FILES = {
    "modules.json an object": ("modules.json", '{"a": 1}', "holds an object, not a list"),
    "a module a string": ("modules.json", '["x"]', "module 0 is a string"),
    "pooling a list": ("1_Pooling/config.json", "[1]", "holds a list"),
    "pooling flag a string": ("1_Pooling/config.json", '{"pooling_mode_mean_tokens": true, '
                              '"pooling_mode_cls_token": "false"}', "pooling_mode_cls_token 'false'"),
    "max_seq_length 1": ("sentence_bert_config.json", '{"max_seq_length": 1}', "max_seq_length 1 < 2"),
    "max_seq_length 100.7": ("sentence_bert_config.json", '{"max_seq_length": 100.7}', "max_seq_length 100.7"),
    "prompts a list": ("config_sentence_transformers.json", '{"prompts": ["a"]}', "prompts is a list"),
    # was the word "None" put in front of every query
    "a null prompt": ("config_sentence_transformers.json", '{"prompts": {"query": null}}', "query is null"),
}


@pytest.mark.parametrize("case", list(ST_FILES))
def test_sentence_transformers_files_of_the_wrong_shape_are_refused(minilm_dir, tmp_path, case):
    name, content, said = ST_FILES[case]
    model = copy_model(minilm_dir, tmp_path / "m")
    (model / name).write_text(content)
    refused(model, str(model / name), said)


@pytest.mark.parametrize("content", ["{", "{}", '{"weight_map": {"a": 5}}', "[]"])
def test_a_damaged_checkpoint_index_is_refused(minilm_dir, tmp_path, content):
    model = copy_model(minilm_dir, tmp_path / "m")
    (model / "model.safetensors.index.json").write_text(content)
    refused(model, "model.safetensors.index.json")


def test_checkpoint_layers_beyond_config_json_are_refused_not_dropped(minilm_dir, tmp_path):
    model = copy_model(minilm_dir, tmp_path / "m")
    edit_json(model / "config.json", lambda c: c.update(num_hidden_layers=3))  # the checkpoint holds 6
    refused(model, "encoder.layer.3.", "config.json")
    # its tensors petal never reads (the pooler, saved position ids) still load
    assert petal.Embedder(str(minilm_dir), "cpu").encode("glaciers").shape == (1, 384)


def test_the_same_in_a_pickle_checkpoint(tiny_bert_dir, tmp_path):
    from safetensors.torch import load_file

    model = copy_model(tiny_bert_dir, tmp_path / "m")
    torch.save(load_file(tiny_bert_dir / "model.safetensors"), model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    edit_json(model / "config.json", lambda c: c.update(num_hidden_layers=1))
    refused(model, "encoder.layer.1.", allow_pickle_weights=True)


def test_an_integer_tensor_for_a_float_weight_is_refused(tiny_bert_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    model = copy_model(tiny_bert_dir, tmp_path / "m")
    tensors = load_file(tiny_bert_dir / "model.safetensors")
    name = next(k for k in tensors if k.endswith("output.dense.bias"))
    tensors[name] = tensors[name].to(torch.int32)
    (model / "model.safetensors").unlink()
    save_file(tensors, model / "model.safetensors")
    refused(model, name, "int32")  # was a RuntimeError from load_state_dict


class Hostile:
    def __reduce__(self) -> tuple:
        return (os.system, ("touch hostile-pickle-ran",))


@pytest.mark.parametrize("content", ["garbage", "hostile"])
def test_a_pickle_that_is_no_state_dict_is_refused(tiny_bert_dir, tmp_path, monkeypatch, content):
    monkeypatch.chdir(tmp_path)
    model = copy_model(tiny_bert_dir, tmp_path / "m")
    (model / "model.safetensors").unlink()
    if content == "garbage":
        (model / "pytorch_model.bin").write_bytes(b"not a pickle at all")
    else:
        torch.save({"embeddings.word_embeddings.weight": Hostile()}, model / "pytorch_model.bin")
    message = refused(model, str(model / "pytorch_model.bin"), allow_pickle_weights=True)
    assert "weights_only=False" not in message  # torch's advice to load it unsafely is not passed on
    assert not (tmp_path / "hostile-pickle-ran").exists()


def test_a_tokenizer_json_that_does_not_load_is_refused(minilm_dir, tmp_path):
    model = copy_model(minilm_dir, tmp_path / "m")
    (model / "tokenizer.json").write_text("{}")
    refused(model, str(model / "tokenizer.json"))
    run = petal_embed("--model", str(model), "glaciers")
    assert run.rc == 78 and "Traceback" not in run.stderr and "tokenizer.json" in run.stderr


def test_a_tokenizer_of_a_larger_vocabulary_is_refused_before_the_model_runs(minilm_dir, tmp_path):
    model = tmp_path / "tiny"
    make_model("bert", model)  # a 68-word vocabulary
    assert petal.Embedder(str(model), "cpu").encode("glaciers move").shape[0] == 1
    shutil.copy(minilm_dir / "tokenizer.json", model / "tokenizer.json")  # 30522 tokens
    refused(model, "tokenizer.json", "vocab_size")  # was an IndexError (CUDA: a device-side assert)
    run = petal_embed("--model", str(model), "zebra quantum")
    assert run.rc == 78 and "Traceback" not in run.stderr, run.stderr


def test_max_length_above_the_models_limit_is_a_usage_error(minilm_dir):
    with pytest.raises(petal.PetalError) as info:
        petal.Embedder(str(minilm_dir), "cpu", max_length=100_000)
    assert info.value.exit_code == 2 and "512" in str(info.value)
    run = petal_embed("--max-length", "100000", "glaciers")
    assert run.rc == 2 and "512" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("keyword", [{"model": 123}, {"model": b"/nowhere"}, {"calibration": 1, "quantize": "int8"}])
def test_embedder_paths_of_the_wrong_type_are_usage_errors(keyword):
    with pytest.raises(petal.UsageError) as info:
        petal.Embedder(**keyword)
    assert next(iter(keyword)) in str(info.value)


@pytest.mark.parametrize("query", ["no", 1, None])
def test_encode_query_must_be_a_bool(minilm_dir, query):
    embedder = petal.Embedder(str(minilm_dir), "cpu")
    with pytest.raises(petal.UsageError, match="query"):
        embedder.encode(["glaciers"], query=query)


def test_a_model_path_that_is_a_file_says_so(minilm_dir):
    with pytest.raises(petal.ConfigError, match="is not a directory"):
        petal.Embedder(str(minilm_dir / "config.json"), "cpu")


@pytest.mark.parametrize("tokenizer", ["larger", "unreadable"])
def test_petal_index_refuses_a_tokenizer_it_cannot_use(minilm_dir, tmp_path, tokenizer):
    """petal index tokenizes in its own stage (not Embedder's): a tokenizer of a larger vocabulary than the model's
    table was an IndexError traceback (CUDA: a device-side assert), an unreadable one a bare Exception. Both 78
    naming tokenizer.json, with the report written and nothing published."""
    model = tmp_path / "tiny"
    make_model("bert", model)  # a 68-word vocabulary
    if tokenizer == "larger":
        shutil.copy(minilm_dir / "tokenizer.json", model / "tokenizer.json")  # 30522 tokens
    else:
        (model / "tokenizer.json").write_text('{"model": 5}')
    out, report = tmp_path / "out", tmp_path / "report.json"
    run = forkrun.petal(["index", str(Path(__file__).resolve().parents[1] / "sample_data"), "--out", str(out),
                         "--model", str(model), "--device", "cpu", "--json-report", str(report)], timeout=300)
    assert run.rc == 78, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and "tokenizer.json" in run.stderr.strip().splitlines()[-1]
    assert json.loads(report.read_text())["exit_code"] == 78
    assert not (out / "CURRENT").exists()


def test_a_directory_with_vocab_txt_and_no_tokenizer_json_says_how_to_write_one(minilm_dir, tmp_path):
    """A BERT saved with a slow tokenizer only (vocab.txt): refused (petal tokenizes with tokenizer.json), saying
    which file it has and how to write tokenizer.json; following that gives the packaged model's vectors."""
    from transformers import AutoTokenizer

    model = copy_model(minilm_dir, tmp_path / "slow")
    (model / "tokenizer.json").unlink()
    message = refused(model, "no tokenizer.json", "it has vocab.txt",
                      f"AutoTokenizer.from_pretrained({str(model)!r}).save_pretrained({str(model)!r})")
    result = petal_embed("glaciers", "--model", str(model))
    assert result.rc == 78 and "save_pretrained" in result.last_line, result.stderr
    AutoTokenizer.from_pretrained(str(model)).save_pretrained(str(model))
    with petal.Embedder(str(model), "cpu") as slow, petal.Embedder(device="cpu") as packaged:
        assert slow.encode(TEXTS_FEW).tolist() == packaged.encode(TEXTS_FEW).tolist()
    assert message.count("vocab.txt") == 1


def test_tokenizer_json_only_and_config_keys_petal_does_not_read_embed_as_the_packaged_model(minilm_dir, tmp_path):
    model = copy_model(minilm_dir, tmp_path / "fast")
    (model / "vocab.txt").unlink()
    edit_json(model / "config.json", lambda c: c.update(
        id2label={"0": "a"}, label2id={"a": 0}, torch_dtype="float16", problem_type=None, note={"nested": [1]}))
    with petal.Embedder(str(model), "cpu") as fast, petal.Embedder(device="cpu") as packaged:
        assert fast.encode(TEXTS_FEW).tolist() == packaged.encode(TEXTS_FEW).tolist()


TEXTS_FEW = ["glaciers move slowly", "a cat on a mat", "x"]
