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
