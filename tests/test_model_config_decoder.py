"""config.json ``"is_decoder": true`` on a BERT-family model: transformers builds its self-attention causal, so
sentence-transformers' vectors change; petal ignored the key and embedded bidirectionally (other vectors, exit 0).
Refused 78 naming config.json and is_decoder. Real MiniLM files, sentence-transformers as the witness."""

from __future__ import annotations

import numpy as np
import pytest

import petal
from tests.test_model_dir_audit import copy_model, edit_json

TEXTS = ["glaciers move slowly", "bread dough rises"]


def minilm_decoder(minilm_dir, tmp_path):
    path = copy_model(minilm_dir, tmp_path / "minilm")
    edit_json(path / "config.json", lambda config: config.update(is_decoder=True))
    return path


def test_is_decoder_changes_what_sentence_transformers_computes(minilm_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    plain = SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS)
    causal = SentenceTransformer(str(minilm_decoder(minilm_dir, tmp_path)), device="cpu").encode(TEXTS)
    assert np.abs(plain - causal).max() > 0.05


def test_is_decoder_is_refused_naming_the_file_and_key(minilm_dir, tmp_path):
    path = minilm_decoder(minilm_dir, tmp_path)
    with pytest.raises(petal.ConfigError) as info:
        petal.Embedder(str(path), "cpu").encode(TEXTS)
    assert info.value.exit_code == 78
    assert f"{path / 'config.json'}: is_decoder is true" in str(info.value)


def test_the_cli_exits_78_for_is_decoder(minilm_dir, tmp_path):
    from tests import forkrun

    path = minilm_decoder(minilm_dir, tmp_path)
    result = forkrun.petal(["embed", "--device", "cpu", "--model", str(path), "glaciers move"], timeout=300)
    assert result.rc == 78, result.stderr
    assert "is_decoder is true" in result.stderr and "Traceback" not in result.stderr
