"""The default max length of a model directory that gives no ``max_seq_length`` (no sentence_bert_config.json, or
one without the key): sentence-transformers and the tokenizer truncate at ``min(max_position_embeddings,
tokenizer_config.json's model_max_length)``, and so does petal (tiny random BERT, sentence-transformers as the
reference); a ``max_seq_length`` or ``--max-length`` still wins, transformers' "no limit" value is no limit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from petal.engine.loader import inspect_model
from tests.tiny_models import make_model

LONG = ["glaciers flow by internal deformation of the ice " * 12, "bread dough rises"]


def tokenizer_limit(path, value) -> None:
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["model_max_length"] = value
    (path / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("sentence_bert_config", ["absent", "without max_seq_length"])
def test_tokenizer_model_max_length_bounds_the_default(tmp_path, sentence_bert_config):
    from sentence_transformers import SentenceTransformer

    import petal

    path = tmp_path / "bert"
    make_model("bert", path)
    if sentence_bert_config == "absent":
        (path / "sentence_bert_config.json").unlink()
    else:
        (path / "sentence_bert_config.json").write_text(json.dumps({"do_lower_case": False}))
    tokenizer_limit(path, 16)
    assert inspect_model(path).pooling.max_length == 16
    reference = SentenceTransformer(str(path), device="cpu")
    assert reference.max_seq_length == 16
    with petal.Embedder(str(path), device="cpu") as embedder:
        ours = np.asarray(embedder.encode(LONG))
    cosine = (ours * reference.encode(LONG)).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(
        reference.encode(LONG), axis=1)
    assert cosine.min() >= 0.9999, cosine
    assert inspect_model(path, max_length=100).pooling.max_length == 100  # the user's setting still wins


def test_max_seq_length_and_no_limit_values(tmp_path):
    path = tmp_path / "bert"
    make_model("bert", path)  # sentence_bert_config.json: max_seq_length 128; max_position_embeddings 160
    tokenizer_limit(path, 16)
    assert inspect_model(path).pooling.max_length == 128  # sentence-transformers' max_seq_length wins
    (path / "sentence_bert_config.json").unlink()
    for value, expected in ((1000000000000000019884624838656, 160), (1e30, 160), (None, 160), ("512", 160),
                            (64.0, 64), (1000, 160)):
        tokenizer_limit(path, value)
        assert inspect_model(path).pooling.max_length == expected, value


def test_max_seq_length_0_is_no_limit_as_sentence_transformers_reads_it(tmp_path):
    """``max_seq_length: 0`` was taken as none given: petal cut at tokenizer_config.json's ``model_max_length`` (16)
    while sentence-transformers 6.3 sets the tokenizer's limit to 0, which transformers takes as no limit, and embeds
    the whole text: other vectors at exit 0 (and README said a value below 2 is refused). Now 0 is no limit, cut at
    the model's positions only; 1 and below 0 are refused (78) naming the file."""
    from sentence_transformers import SentenceTransformer

    import petal
    from petal.engine.errors import ModelError

    path = tmp_path / "bert"
    make_model("bert", path)  # max_position_embeddings 160
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 0, "do_lower_case": False}))
    tokenizer_limit(path, 16)
    assert inspect_model(path).pooling.max_length == 160
    reference = SentenceTransformer(str(path), device="cpu")
    assert reference.max_seq_length == 0
    expected = reference.encode(LONG)
    with petal.Embedder(str(path), device="cpu") as embedder:
        ours = np.asarray(embedder.encode(LONG))
    cosine = (ours * expected).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() >= 0.9999, cosine
    for value in (1, -3):
        (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": value}))
        with pytest.raises(ModelError, match=f"sentence_bert_config.json: max_seq_length {value} < "):
            inspect_model(path)
