"""Model families on the CPU against their reference implementations (tiny random checkpoints):
transformers for hidden states and pooled vectors of packed mixed-length batches (BERT, XLM-R,
Qwen3 causal, Qwen3 bidirectional), sentence-transformers for the files' conventions (prompts,
EOS, last-token pooling, Dense, Normalize); then what petal refuses, and where it finds models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from petal.engine.batch import PackedBatch
from petal.engine.config import EngineConfig, ModelOptions
from petal.engine.engine import Engine
from petal.engine.errors import ModelError, ModelFlagError
from petal.engine.loader import inspect_model
from petal.engine.models import supported_architectures
from petal.pipeline.ingest.tokens import tokenizer_for
from petal.pipeline.jobs.embed import encode_texts
from tests.tiny_models import QUERY_PROMPT, TEXTS, make_model, vocab

LENGTHS = [1, 2, 7, 33, 64, 5, 18]  # one packed batch of mixed lengths
# family -> (pooling, normalize, attends both ways)
FAMILIES = {"bert": ("mean", True, True), "xlm-roberta": ("cls", True, True),
            "qwen3-embedding": ("last", True, False), "pplx-embed": ("mean", False, True)}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {family: (root / family, make_model(family, root / family)) for family in FAMILIES}


def hf_hidden(trunk: torch.nn.Module, ids: np.ndarray, bidirectional: bool) -> torch.Tensor:
    """One sequence through Hugging Face: ``[len, hidden]``. An all-ones 4-D boolean mask makes
    HF Qwen3 (causal by default) attend both ways."""
    input_ids = torch.from_numpy(ids.astype(np.int64))[None]
    mask = torch.ones(1, 1, len(ids), len(ids), dtype=torch.bool) if bidirectional else None
    with torch.no_grad():
        return trunk(input_ids=input_ids, attention_mask=mask).last_hidden_state[0]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_batch_matches_transformers(checkpoints, family):
    path, trunk = checkpoints[family]
    pooling, normalize, both_ways = FAMILIES[family]
    spec = inspect_model(path)
    assert (spec.pooling.mode, spec.pooling.normalize, spec.config.causal) == (pooling, normalize, not both_ways)
    engine = Engine(spec, EngineConfig(token_budget=512, max_seqs=16))
    rng = np.random.default_rng(1)
    # NOTE: ids above the special tokens: XLM-R numbers positions from padding_idx and skips pad ids.
    docs = [rng.integers(len(vocab()) // 4, len(vocab()), n).astype(np.int32) for n in LENGTHS]
    batch = PackedBatch.from_sequences(docs)
    captured: dict[str, torch.Tensor] = {}
    engine.model.register_forward_hook(lambda m, a, out: captured.setdefault("hidden", out))
    pooled = engine.embed(batch)
    hf_qwen3 = family in ("qwen3-embedding", "pplx-embed")
    for i, ids in enumerate(docs):
        ref = hf_hidden(trunk, ids, bidirectional=both_ways and hf_qwen3)
        ours = captured["hidden"][batch.cu_seqlens[i] : batch.cu_seqlens[i + 1]]
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
        vector = {"mean": ref.mean(0), "cls": ref[0], "last": ref[-1]}[pooling]
        if normalize:
            vector = torch.nn.functional.normalize(vector, dim=0)
        np.testing.assert_allclose(pooled[i], vector.numpy(), rtol=1e-4, atol=1e-5)


def test_causal_qwen3_differs_from_bidirectional(checkpoints):
    """The attention mask matters (so the parity above tests something): causal changes early tokens."""
    path, _ = checkpoints["qwen3-embedding"]
    ids = [np.arange(20, 40, dtype=np.int32)]
    causal = Engine(inspect_model(path), EngineConfig(token_budget=256)).embed(PackedBatch.from_sequences(ids))
    both = Engine(inspect_model(path, ModelOptions(attention_mask="bidirectional")),
                  EngineConfig(token_budget=256)).embed(PackedBatch.from_sequences(ids))
    assert np.abs(causal - both).max() > 1e-3


@pytest.mark.parametrize("family", ["qwen3-embedding", "xlm-roberta"])
def test_prompts_eos_and_pooling_match_sentence_transformers(checkpoints, family):
    """Query and document sides through the model files' own conventions, against sentence-transformers."""
    from sentence_transformers import SentenceTransformer

    path, _ = checkpoints[family]
    spec = inspect_model(path)
    engine = Engine(spec, EngineConfig(token_budget=1024))
    st = SentenceTransformer(str(path), device="cpu")
    for side, reference in (("query", st.encode_query), ("document", st.encode_document)):
        ours, _ = encode_texts(engine, tokenizer_for(spec, "query" if side == "query" else "document"), TEXTS)
        np.testing.assert_allclose(ours, reference(TEXTS, convert_to_numpy=True), atol=2e-5)
    if family == "qwen3-embedding":
        assert spec.prompts.query == QUERY_PROMPT and spec.eos_token_id == vocab()["<|endoftext|>"]


def test_eos_appended_when_the_tokenizer_does_not(tmp_path):
    """First Qwen3-Embedding revision: no EOS post-processor, so petal appends it (last token = EOS)."""
    path = tmp_path / "old-qwen3-embedding"
    trunk = make_model("qwen3-embedding", path, eos_in_tokenizer=False)
    spec = inspect_model(path)
    tokenizer = tokenizer_for(spec, "query")
    assert tokenizer.appends_eos
    ids = tokenizer.encode(TEXTS[:2]).token_ids
    assert all(x[-1] == spec.eos_token_id for x in ids)
    short = tokenizer_for(inspect_model(path, max_length=8), "document").encode([TEXTS[4]])
    assert len(short.token_ids[0]) == 8 and short.token_ids[0][-1] == spec.eos_token_id and short.truncated[0]
    for i, text in enumerate(TEXTS[:2]):  # a lone text (the single-text encoder) gets the same ids
        np.testing.assert_array_equal(tokenizer.encode([text]).token_ids[0], ids[i])
    vectors, _ = encode_texts(Engine(spec, EngineConfig(token_budget=512)), tokenizer, TEXTS[:2])
    for row, x in zip(vectors, ids):
        ref = torch.nn.functional.normalize(hf_hidden(trunk, x, bidirectional=False)[-1], dim=0)
        np.testing.assert_allclose(row, ref.numpy(), atol=2e-5)


def test_dense_layers_match_sentence_transformers(tmp_path):
    """A Dense (tanh) between Pooling and Normalize; its weights as safetensors, then as pickle."""
    from sentence_transformers import SentenceTransformer, models

    path = tmp_path / "dense"
    make_model("bert", path)
    torch.manual_seed(3)
    dense = models.Dense(64, 24, bias=True, activation_function=torch.nn.Tanh())
    (path / "2_Dense").mkdir()
    dense.save(str(path / "2_Dense"))
    modules = json.loads((path / "modules.json").read_text())
    modules.insert(2, {"path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    modules = [{**m, "idx": i, "name": str(i)} for i, m in enumerate(modules)]
    (path / "modules.json").write_text(json.dumps(modules))
    st = SentenceTransformer(str(path), device="cpu")
    spec = inspect_model(path)
    assert spec.dim == 24 and [d.activation for d in spec.dense] == ["tanh"]
    ours, _ = encode_texts(Engine(spec, EngineConfig(token_budget=1024)), tokenizer_for(spec), TEXTS)
    np.testing.assert_allclose(ours, st.encode(TEXTS, convert_to_numpy=True), atol=2e-5)

    state = {k: v.clone() for k, v in dense.state_dict().items()}
    (path / "2_Dense" / "model.safetensors").unlink()
    torch.save(state, path / "2_Dense" / "pytorch_model.bin")
    with pytest.raises(ModelError, match=r"pickle.*--allow-pickle-weights"):
        inspect_model(path)
    pickled = inspect_model(path, ModelOptions(allow_pickle_weights=True))
    again, _ = encode_texts(Engine(pickled, EngineConfig(token_budget=1024)), tokenizer_for(pickled), TEXTS)
    np.testing.assert_array_equal(again, ours)


def test_pickle_only_trunk_refused_unless_allowed(tmp_path, checkpoints):
    from safetensors.torch import load_file

    source, _ = checkpoints["bert"]
    path = tmp_path / "pickled"
    shutil.copytree(source, path)
    state = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    torch.save(state, path / "pytorch_model.bin")
    with pytest.raises(ModelError, match=r"only pickle weights .*pytorch_model\.bin.*--allow-pickle-weights"):
        inspect_model(path)
    spec = inspect_model(path, ModelOptions(allow_pickle_weights=True))
    assert spec.weights_format == "pickle"
    batch = PackedBatch.from_sequences([np.arange(10, 30, dtype=np.int32)])
    safe = Engine(inspect_model(source), EngineConfig(token_budget=256)).embed(batch)
    np.testing.assert_array_equal(Engine(spec, EngineConfig(token_budget=256)).embed(batch), safe)


def test_unknown_architecture_lists_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2Model"], "model_type": "gpt2"}))
    with pytest.raises(ModelError) as info:
        inspect_model(tmp_path)
    message = str(info.value)
    assert "'GPT2Model'" in message and all(name in message for name in supported_architectures())
    assert "Qwen3Model" in message and "XLMRobertaModel" in message


def test_qwen3_without_a_statement_is_refused_until_the_user_says(tmp_path):
    path = tmp_path / "bare"
    make_model("qwen3-bare", path)
    with pytest.raises(ModelError) as info:
        inspect_model(path)
    message = str(info.value)
    for found in ("['Qwen3Model']", "'qwen3'", "no use_bidirectional_attention or is_causal", "no modules.json",
                  "--attention-mask causal|bidirectional", "--pooling"):
        assert found in message, (found, message)
    with pytest.raises(ModelError, match="--pooling") as info:
        inspect_model(path, ModelOptions(attention_mask="causal"))
    assert "--attention-mask" not in str(info.value)
    spec = inspect_model(path, ModelOptions(attention_mask="bidirectional", pooling="mean"))
    assert not spec.config.causal and spec.pooling.mode == "mean" and spec.eos_token_id is None
    spec = inspect_model(path, ModelOptions(attention_mask="causal", pooling="last"))
    assert spec.config.causal and spec.eos_token_id == vocab()["<|endoftext|>"]


def test_bert_refuses_a_causal_mask(checkpoints):
    """The user's flag the model cannot take: a ``ModelFlagError`` (mapped to 2 naming the flag), not the model's
    own ``ModelError`` (78)."""
    path, _ = checkpoints["bert"]
    with pytest.raises(ModelFlagError, match="--attention-mask causal: bert models are bidirectional only"):
        inspect_model(path, ModelOptions(attention_mask="causal"))


def test_pplx_embed_files_are_understood(checkpoints):
    path, _ = checkpoints["pplx-embed"]
    spec = inspect_model(path)
    assert spec.config.architecture == "qwen3" and not spec.config.causal
    assert (spec.pooling.mode, spec.pooling.normalize, spec.int8_scheme, spec.similarity) == ("mean", False, "tanh",
                                                                                              "cosine")
    assert spec.config.rope_theta == 5000.0  # transformers 5 writes rope_parameters, not rope_theta


def test_model_id_resolves_from_the_local_hf_cache(tmp_path, monkeypatch, checkpoints):
    source, _ = checkpoints["bert"]
    cache = tmp_path / "hub"
    repo = cache / "models--acme--tiny-bert"
    shutil.copytree(source, repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HOME", raising=False)
    assert inspect_model("acme/tiny-bert").path == repo / "snapshots" / "0123abcd"
    with pytest.raises(ModelError) as info:
        inspect_model("acme/not-there")
    assert str(cache / "models--acme--not-there") in str(info.value) and "never downloads" in str(info.value)


@pytest.mark.parametrize("where", ["XDG_CACHE_HOME", "HUGGINGFACE_HUB_CACHE", "HF_HOME with $VAR"])
def test_model_id_resolves_where_huggingface_hub_keeps_its_cache(tmp_path, monkeypatch, checkpoints, where):
    """A model id is found in the cache huggingface_hub writes to: before, $XDG_CACHE_HOME/huggingface/hub and
    $HUGGINGFACE_HUB_CACHE were not looked in, nor a $VAR in $HF_HOME expanded (78 'never downloads')."""
    import subprocess
    import sys

    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    if where == "XDG_CACHE_HOME":
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    elif where == "HUGGINGFACE_HUB_CACHE":
        monkeypatch.setenv("HUGGINGFACE_HUB_CACHE", str(tmp_path / "old-hub"))
    else:
        monkeypatch.setenv("PETAL_TEST_ROOT", str(tmp_path))
        monkeypatch.setenv("HF_HOME", "$PETAL_TEST_ROOT/hf")
    cache = Path(subprocess.run([sys.executable, "-c", "import huggingface_hub.constants as c; print(c.HF_HUB_CACHE)"],
                                capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    assert str(cache).startswith(str(tmp_path)) and cache != tmp_path / "home" / ".cache" / "huggingface" / "hub"
    source, _ = checkpoints["bert"]
    repo = cache / "models--acme--tiny-bert"
    shutil.copytree(source, repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    assert inspect_model("acme/tiny-bert").path == repo / "snapshots" / "0123abcd"


@pytest.mark.parametrize("bidirectional", [False, True])
def test_benchmark_shape_directories_state_their_attention(tmp_path, minilm_dir, bidirectional):
    """Qwen3 directories saved with their attention stated (as the benchmarks' ``--shape`` ones) load as said."""
    from tests.parity import Shape, hf_model, save_model_dir

    config = {"architectures": ["Qwen3Model"], "model_type": "qwen3", "vocab_size": 30522, "hidden_size": 32,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
              "intermediate_size": 64, "max_position_embeddings": 256, "rope_theta": 1_000_000.0,
              **({"use_bidirectional_attention": True} if bidirectional else {})}
    shape = Shape("tiny", config, "mean" if bidirectional else "last", not bidirectional, 128)
    path = save_model_dir(shape, hf_model(shape, torch.device("cpu"), torch.float32), minilm_dir, tmp_path / "m")
    spec = inspect_model(path)
    assert spec.config.causal is not bidirectional and spec.pooling.mode == shape.pooling
