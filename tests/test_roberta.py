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
from click.testing import CliRunner

import petal
from petal.cli.main import cli
from tests.conftest import write_shard
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


def write_roberta(path: Path) -> Path:
    """A tiny random ``RobertaModel`` saved with safetensors, as sentence-transformers saves one (mean, normalized)."""
    import transformers

    path.mkdir()
    torch.manual_seed(0)
    config = transformers.RobertaConfig(
        vocab_size=write_roberta_tokenizer(path), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=34, type_vocab_size=1, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, layer_norm_eps=1e-5)
    _perturb(transformers.RobertaModel(config, add_pooling_layer=True)).save_pretrained(path)
    write_st(path, "mean", True, max_seq_length=32)
    assert json.loads((path / "config.json").read_text())["model_type"] == "roberta"
    return path


def test_a_roberta_model_embeds_as_sentence_transformers_does(tmp_path):
    from sentence_transformers import SentenceTransformer

    path = write_roberta(tmp_path / "roberta")
    texts = [*TEXTS, "glaciers " * 40]  # the last ones longer than 32 tokens: cut as transformers cuts them
    st = SentenceTransformer(str(path), device="cpu")
    reference = np.stack([st.encode([t], convert_to_numpy=True)[0] for t in texts])
    with petal.Embedder(str(path), device="cpu") as embedder:
        ours = np.asarray(embedder.encode(texts))
    np.testing.assert_allclose(ours, reference, atol=2e-5)


def _docs(path: Path, start: int) -> Path:
    return write_shard(path, {"id": list(range(start, start + len(TEXTS))), "text": TEXTS})


def _recorded(out: Path) -> dict[str, object]:
    manifest = json.loads((out / "versions" / (out / "CURRENT").read_text().strip() / "manifest.json").read_text())
    return {"model": manifest["model"]["architecture"], "embedding": manifest["embedding"]["architecture"],
            "config": manifest["embedding"]["model_config"]["architecture"]}


def test_an_index_of_a_roberta_model_records_roberta_and_petal_info_says_so(tmp_path):
    model = write_roberta(tmp_path / "roberta")
    out = tmp_path / "out"
    petal.index([str(_docs(tmp_path / "data" / "a.parquet", 0))], out, model=str(model), device="cpu", quiet=True)
    assert _recorded(out) == {"model": "roberta", "embedding": "roberta", "config": "roberta"}
    info = CliRunner().invoke(cli, ["info", str(out)])
    assert info.exit_code == 0, info.output
    assert "             roberta, mean pooling" in info.output
    assert json.loads(CliRunner().invoke(cli, ["info", str(out), "--json"]).output)["model"]["architecture"] == \
        "roberta"


def test_a_roberta_index_written_as_xlm_roberta_is_searched_and_updated_without_re_embedding(tmp_path, monkeypatch):
    """An index an earlier petal wrote for a RoBERTa model (which named it xlm-roberta: the registry sent roberta
    to the XLM-RoBERTa family) is queried, and updated incrementally reusing its stored vectors."""
    from petal.engine.models import MODEL_REGISTRY
    from petal.engine.models.families import XLM_ROBERTA

    model = write_roberta(tmp_path / "roberta")
    out = tmp_path / "out"
    settings = {"model": str(model), "device": "cpu", "quiet": True}
    with monkeypatch.context() as before:
        before.setitem(MODEL_REGISTRY, "roberta", XLM_ROBERTA)
        before.setitem(MODEL_REGISTRY, "RobertaModel", XLM_ROBERTA)
        petal.index([str(_docs(tmp_path / "data" / "a.parquet", 0))], out, **settings)
    assert _recorded(out) == {"model": "xlm-roberta", "embedding": "xlm-roberta", "config": "xlm-roberta"}

    with petal.open_index(out, device="cpu") as index:
        hits = index.search([TEXTS[2]], k=3)[0]
    assert hits[0].id == 2
    query = CliRunner().invoke(cli, ["query", str(out), TEXTS[2], "-k", "1", "--json"])
    assert query.exit_code == 0, query.output
    assert json.loads(query.output.splitlines()[0])["hits"][0]["id"] == 2

    _docs(tmp_path / "data" / "b.parquet", 100)
    report = petal.index([str(tmp_path / "data")], out, **settings)
    assert report.rows["embedded"] == len(TEXTS) and report.rows["reused"] == len(TEXTS)
    # the vectors' settings keep the name they were stored under (their fingerprints); the model is named as it is
    assert _recorded(out) == {"model": "roberta", "embedding": "xlm-roberta", "config": "xlm-roberta"}
    with petal.open_index(out, device="cpu") as index:
        assert {h.id for h in index.search([TEXTS[2]], k=2)[0]} == {2, 102}  # the same text in both shards
    petal.index([str(tmp_path / "data")], out, **settings, full=True)  # re-embedded: recorded as it is
    assert _recorded(out) == {"model": "roberta", "embedding": "roberta", "config": "roberta"}
