"""``model_type: roberta`` checkpoints (sentence-transformers all-roberta-large-v1, all-distilroberta-v1) load
through the XLM-RoBERTa family: the same weight names, positions numbered from ``pad_token_id + 1``, one token
type. A tiny random ``RobertaModel`` (with the pooler sentence-transformers saves), a real byte-level BPE
tokenizer trained here with RoBERTa's post-processor, sentence-transformers (over transformers' RobertaModel) as
the reference, long texts cut at max_position_embeddings - 2 as transformers does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

import petal
from tests.tiny_models import TEXTS, WORDS, _perturb, write_st

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's ids: <pad> is 1


def write_roberta_tokenizer(path: Path) -> int:
    """A byte-level BPE ``tokenizer.json`` as RoBERTa's (``<s> ... </s>``), trained on the test words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(WORDS), *TEXTS], trainer)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True,
                                                      add_prefix_space=False)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512, "bos_token": "<s>",
         "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>"}))
    return tok.get_vocab_size()


def test_a_roberta_model_embeds_as_sentence_transformers_does(tmp_path):
    import transformers
    from sentence_transformers import SentenceTransformer

    path = tmp_path / "roberta"
    path.mkdir()
    torch.manual_seed(0)
    config = transformers.RobertaConfig(
        vocab_size=write_roberta_tokenizer(path), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=34, type_vocab_size=1, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, layer_norm_eps=1e-5)
    _perturb(transformers.RobertaModel(config, add_pooling_layer=True)).save_pretrained(path)
    write_st(path, "mean", True, max_seq_length=32)
    assert json.loads((path / "config.json").read_text())["model_type"] == "roberta"
    texts = [*TEXTS, "glaciers " * 40]  # the last ones longer than 32 tokens: cut as transformers cuts them
    st = SentenceTransformer(str(path), device="cpu")
    reference = np.stack([st.encode([t], convert_to_numpy=True)[0] for t in texts])
    with petal.Embedder(str(path), device="cpu") as embedder:
        ours = np.asarray(embedder.encode(texts))
    np.testing.assert_allclose(ours, reference, atol=2e-5)
