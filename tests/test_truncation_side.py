"""tokenizer_config.json's ``truncation_side``: sentence-transformers (through transformers' fast tokenizer) cuts a
long text from the side it names; petal keeps a text's beginning only, so ``left`` (or a value transformers
refuses) is refused with 78 naming the file and the key, never silently cut from the other side. Real
tokenizer.json and checkpoint of a tiny random BERT, sentence-transformers as the reference."""

from __future__ import annotations

import json

import numpy as np
import pytest

import petal
from tests.tiny_models import make_model

LONG = "glaciers move " * 10 + "bread dough rises"


def set_side(path, side):
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["truncation_side"] = side
    config_file.write_text(json.dumps(config))


def model_and_reference(path, side):
    """A tiny BERT in ``path`` whose tokenizer_config.json says ``side``; sentence-transformers on it at 8 tokens."""
    from sentence_transformers import SentenceTransformer

    make_model("bert", path)
    set_side(path, side)
    st = SentenceTransformer(str(path), device="cpu")
    st.max_seq_length = 8
    return st


def test_left_truncation_is_refused_since_sentence_transformers_keeps_the_end(tmp_path):
    path = tmp_path / "bert"
    st = model_and_reference(path, "left")
    ids = st.tokenize([LONG])["input_ids"][0].tolist()
    words = st.tokenizer.convert_ids_to_tokens(ids)
    assert words[-4:-1] == ["bread", "dough", "rises"], words  # the end kept: cut from the left
    with pytest.raises(petal.ConfigError) as info:
        petal.Embedder(str(path), "cpu", max_length=8).encode([LONG])
    assert info.value.exit_code == 78
    assert "tokenizer_config.json" in str(info.value) and "truncation_side is 'left'" in str(info.value)


@pytest.mark.parametrize("side", ["middle", None, 3])
def test_a_truncation_side_transformers_does_not_know_is_refused(tmp_path, side):
    path = tmp_path / "bert"
    make_model("bert", path)
    set_side(path, side)
    with pytest.raises(petal.ConfigError) as info:
        petal.Embedder(str(path), "cpu").encode([LONG])
    assert info.value.exit_code == 78 and "truncation_side" in str(info.value)


def test_right_truncation_embeds_as_sentence_transformers_does(tmp_path):
    path = tmp_path / "bert"
    st = model_and_reference(path, "right")
    reference = st.encode([LONG], convert_to_numpy=True)
    ours = np.asarray(petal.Embedder(str(path), "cpu", max_length=8).encode([LONG]))
    np.testing.assert_allclose(ours, reference, atol=2e-5)


# tokenizer.json's own truncation direction: transformers takes it as truncation_side unless tokenizer_config.json
# names one (the packaged MiniLM, edited; sentence-transformers as the reference)

def minilm_with_direction(minilm_dir, tmp_path, direction, config_side=None):
    from tests.test_model_dir_audit import copy_model

    path = copy_model(minilm_dir, tmp_path / "minilm")
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    tokenizer["truncation"] = {"direction": direction, "max_length": 128, "strategy": "LongestFirst", "stride": 0}
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    if config_side is not None:
        set_side(path, config_side)
    return path


def reference(path):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(path), device="cpu")
    st.max_seq_length = 8
    return st


def test_a_tokenizer_json_that_truncates_from_the_left_is_refused(minilm_dir, tmp_path):
    path = minilm_with_direction(minilm_dir, tmp_path, "Left")
    st = reference(path)
    words = st.tokenizer.convert_ids_to_tokens(st.tokenize([LONG])["input_ids"][0].tolist())
    assert words[-4:-1] == ["bread", "dough", "rises"], words  # sentence-transformers keeps the end
    with pytest.raises(petal.ConfigError) as info:
        petal.Embedder(str(path), "cpu", max_length=8).encode([LONG])
    assert info.value.exit_code == 78
    assert f"{path / 'tokenizer.json'}: truncation.direction is 'left'" in str(info.value)


def test_the_cli_exits_78_for_a_left_truncating_tokenizer_json(minilm_dir, tmp_path):
    from tests import forkrun

    path = minilm_with_direction(minilm_dir, tmp_path, "Left")
    result = forkrun.petal(["embed", "--device", "cpu", "--model", str(path), "glaciers move"], timeout=300)
    assert result.rc == 78, result.stderr
    assert "truncation.direction" in result.stderr and "Traceback" not in result.stderr


def test_tokenizer_config_right_overrides_a_left_tokenizer_json(minilm_dir, tmp_path):
    path = minilm_with_direction(minilm_dir, tmp_path, "Left", config_side="right")
    expected = reference(path).encode([LONG], convert_to_numpy=True)
    ours = np.asarray(petal.Embedder(str(path), "cpu", max_length=8).encode([LONG]))
    np.testing.assert_allclose(ours, expected, atol=2e-5)


def test_tokenizer_json_max_length_and_padding_change_nothing(minilm_dir, tmp_path):
    """petal sets its own truncation and packs without padding; sentence-transformers passes its own max_length."""
    path = minilm_with_direction(minilm_dir, tmp_path, "Right")
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    tokenizer["truncation"]["max_length"] = 3
    tokenizer["padding"] = {"strategy": {"Fixed": 40}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                            "pad_type_id": 0, "pad_token": "[PAD]"}
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    expected = reference(path).encode([LONG, "glaciers"], convert_to_numpy=True)
    ours = np.asarray(petal.Embedder(str(path), "cpu", max_length=8).encode([LONG, "glaciers"]))
    np.testing.assert_allclose(ours, expected, atol=2e-5)
