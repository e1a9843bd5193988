"""sentence_bert_config.json's ``do_lower_case``: sentence-transformers lower-cases texts for such a model (a Lowercase
normaliser in front of the tokenizer's). Where tokenizer.json lower-cases already, petal's vectors are
sentence-transformers'; where it does not, petal cannot reproduce them and refuses the model by name (78) instead
of embedding cased texts the model never saw (tiny random BERT, real tokenizers, sentence-transformers)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from petal.engine.errors import ModelError
from petal.engine.loader import inspect_model
from tests.tiny_models import make_model

TEXTS = ["How do GLACIERS move?", "Bread Dough Rises because Yeast ferments sugars"]


def lower_case(path, value: bool = True) -> None:
    config = json.loads((path / "sentence_bert_config.json").read_text())
    (path / "sentence_bert_config.json").write_text(json.dumps({**config, "do_lower_case": value}))


def cased_tokenizer(path) -> None:
    """tokenizer.json without its Lowercase normaliser."""
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    tokenizer["normalizer"] = None
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    path = tmp_path_factory.mktemp("lower") / "bert"
    make_model("bert", path)
    return path


def test_a_tokenizer_that_lower_cases_embeds_as_sentence_transformers(bert, tmp_path, minilm_dir):
    from sentence_transformers import SentenceTransformer

    import petal

    path = tmp_path / "bert"
    shutil.copytree(bert, path)
    lower_case(path)
    reference = SentenceTransformer(str(path), device="cpu").encode(TEXTS)
    with petal.Embedder(str(path), device="cpu") as embedder:
        np.testing.assert_allclose(np.asarray(embedder.encode(TEXTS)), reference, atol=2e-5)
    minilm = tmp_path / "minilm"  # BertNormalizer(lowercase=True)
    shutil.copytree(minilm_dir, minilm)
    lower_case(minilm)
    assert inspect_model(minilm).pooling.max_length == 256


def test_a_tokenizer_that_keeps_case_is_refused_naming_do_lower_case(bert, tmp_path):
    path = tmp_path / "bert"
    shutil.copytree(bert, path)
    cased_tokenizer(path)
    inspect_model(path)  # do_lower_case false: the tokenizer as it is
    lower_case(path)
    with pytest.raises(ModelError, match="do_lower_case true"):
        inspect_model(path)
    done = subprocess.run([str(Path(sys.executable).parent / "petal"), "embed", "--model", str(path), "Glaciers"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 78 and "do_lower_case true" in done.stderr and "Traceback" not in done.stderr
    lower_case(path, False)
    assert inspect_model(path).pooling.mode == "mean"
