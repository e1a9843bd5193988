"""tokenizer.json with ``"post_processor": null``: transformers 5 builds a post-processor back for the tokenizer class
tokenizer_config.json names. ``BertTokenizer`` (the packaged MiniLM's) rebuilds [CLS] ... [SEP], so
sentence-transformers adds them while petal, running the file as it is, did not (other vectors, exit 0). Refused 78
naming tokenizer.json and post_processor; the generic ``PreTrainedTokenizerFast`` adds no token in transformers either
(add_eos_token true included), and embeds as sentence-transformers does. Real MiniLM files, sentence-transformers as
the reference."""

from __future__ import annotations

import json

import numpy as np
import pytest

import petal
from tests.test_model_dir_audit import copy_model

TEXTS = ["glaciers move slowly", "bread dough rises"]


def minilm_without_post_processor(minilm_dir, tmp_path, **tokenizer_config):
    path = copy_model(minilm_dir, tmp_path / "minilm")
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    tokenizer["post_processor"] = None
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((path / "tokenizer_config.json").read_text())
    config.update(tokenizer_config)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def reference(path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu")


def test_a_bert_tokenizer_without_post_processor_is_refused(minilm_dir, tmp_path):
    path = minilm_without_post_processor(minilm_dir, tmp_path)
    st = reference(path)
    words = st.tokenizer.convert_ids_to_tokens(st.tokenize(TEXTS[:1])["input_ids"][0].tolist())
    assert words[0] == "[CLS]" and words[-1] == "[SEP]", words  # transformers rebuilt BERT's post-processor
    with pytest.raises(petal.ConfigError) as info:
        petal.Embedder(str(path), "cpu").encode(TEXTS)
    assert info.value.exit_code == 78
    message = str(info.value)
    assert f"{path / 'tokenizer.json'}: post_processor is null" in message and "'BertTokenizer'" in message


def test_the_cli_exits_78_naming_the_post_processor(minilm_dir, tmp_path):
    from tests import forkrun

    path = minilm_without_post_processor(minilm_dir, tmp_path)
    result = forkrun.petal(["embed", "--device", "cpu", "--model", str(path), "glaciers move"], timeout=300)
    assert result.rc == 78, result.stderr
    assert "post_processor is null" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("extra", [{}, {"add_eos_token": True, "eos_token": "[SEP]"}])
def test_the_generic_class_adds_nothing_and_embeds_as_sentence_transformers(minilm_dir, tmp_path, extra):
    path = minilm_without_post_processor(minilm_dir, tmp_path, tokenizer_class="PreTrainedTokenizerFast", **extra)
    st = reference(path)
    assert st.tokenizer.convert_ids_to_tokens(st.tokenize(TEXTS[:1])["input_ids"][0].tolist())[-1] == "slowly"
    expected = st.encode(TEXTS, convert_to_numpy=True)
    np.testing.assert_allclose(np.asarray(petal.Embedder(str(path), "cpu").encode(TEXTS)), expected, atol=2e-5)
