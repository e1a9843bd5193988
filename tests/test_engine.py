"""[4]-[5] The engine on the CPU: parity with Hugging Face and sentence-transformers, packing
invariance, pooling modes, precision modes, the LazyTensor ring."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from petal.engine.batch import PackedBatch
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine
from petal.engine.lazy_tensor import HostRing
from petal.engine.loader import inspect_model
from petal.pipeline.ingest.tokens import TextTokenizer
from petal.pipeline.jobs.embed import encode_texts

TEXTS = [
    "How do glaciers move?",
    "Glaciers flow by internal deformation of the ice and by sliding over a film of meltwater at their base.",
    "Bread dough rises because yeast ferments sugars and releases carbon dioxide.",
    "A",
    "Vector search finds the nearest neighbours of a query embedding among millions of documents. " * 12,
    "Le glacier avance lentement vers la vallée.",
    "GPUs saturate on tokens, not sequences.",
]


def rows_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def hf_reference(model_dir, texts, max_length, pooling):
    """Hugging Face BertModel with padding + attention mask, pooled like sentence-transformers."""
    from transformers import AutoModel

    tok = TextTokenizer(model_dir / "tokenizer.json", max_length)
    ids = tok.encode(texts).token_ids
    model = AutoModel.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    width = max(len(x) for x in ids)
    input_ids = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.from_numpy(x.astype(np.int64))
        mask[i, : len(x)] = 1
    with torch.no_grad():
        hidden = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
    if pooling == "cls":
        pooled = hidden[:, 0]
    elif pooling == "last":
        pooled = hidden[torch.arange(len(ids)), mask.sum(1) - 1]
    else:
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    return pooled.numpy(), ids


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_tiny_bert_matches_transformers(tiny_bert_dir, pooling):
    spec = inspect_model(tiny_bert_dir, pooling=pooling, normalize=False)
    engine = Engine(spec, EngineConfig(token_budget=1024))
    ref, ids = hf_reference(tiny_bert_dir, TEXTS, spec.pooling.max_length, pooling)
    ours = engine.embed(PackedBatch.from_sequences(ids))
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)


def test_tiny_bert_hidden_states_match_transformers(tiny_bert_dir):
    from transformers import AutoModel

    spec = inspect_model(tiny_bert_dir)
    engine = Engine(spec, EngineConfig(token_budget=1024))
    ids = TextTokenizer(spec.tokenizer_file, 128).encode(TEXTS[:3]).token_ids
    batch = PackedBatch.from_sequences(ids)
    captured = {}
    engine.model.register_forward_hook(lambda m, a, out: captured.setdefault("h", out))
    engine.embed(batch)
    hf = AutoModel.from_pretrained(tiny_bert_dir).eval()
    for i, x in enumerate(ids):
        with torch.no_grad():
            ref = hf(input_ids=torch.from_numpy(x.astype(np.int64))[None]).last_hidden_state[0]
        ours = captured["h"][batch.cu_seqlens[i] : batch.cu_seqlens[i + 1]]
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def minilm_engine(minilm_spec):
    return Engine(minilm_spec, EngineConfig(token_budget=2048))


@pytest.fixture(scope="module")
def st_model(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


def long_and_mixed_texts() -> dict[str, list[str]]:
    rng = np.random.default_rng(0)
    words = ("ice sheet glacier moraine crevasse meltwater basal sliding flow valley fjord climate snow "
             "pressure plastic deformation surge calving iceberg bedrock").split()
    long = [" ".join(rng.choice(words, 600)) for _ in range(4)]  # > 256 tokens: truncated
    mixed = [" ".join(rng.choice(words, int(n))) for n in rng.integers(1, 300, 40)]
    return {"short": TEXTS, "long": long, "mixed": mixed + TEXTS}


@pytest.mark.parametrize("kind", ["short", "long", "mixed"])
def test_minilm_matches_sentence_transformers(minilm_engine, minilm_spec, st_model, kind):
    texts = long_and_mixed_texts()[kind]
    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, minilm_spec.pooling.max_length)
    ours, truncated = encode_texts(minilm_engine, tokenizer, texts)
    ref = st_model.encode(texts, batch_size=16, convert_to_numpy=True)
    assert rows_cosine(ours, ref).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # the model's Normalize module
    if kind == "long":
        assert truncated == len(texts)


def test_minilm_bf16_gemms_stay_close(minilm_spec, minilm_engine):
    texts = long_and_mixed_texts()["mixed"]
    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, minilm_spec.pooling.max_length)
    fp32, _ = encode_texts(minilm_engine, tokenizer, texts)
    bf16, _ = encode_texts(Engine(minilm_spec, EngineConfig(dtype="bfloat16", token_budget=2048)), tokenizer, texts)
    cos = rows_cosine(fp32, bf16)
    assert cos.min() >= 0.9999
    assert not np.array_equal(fp32, bf16)  # the bf16 path really ran


def test_packed_equals_one_at_a_time(minilm_engine, minilm_spec):
    texts = long_and_mixed_texts()["mixed"]
    ids = TextTokenizer(minilm_spec.tokenizer_file, minilm_spec.pooling.max_length).encode(texts).token_ids
    ids = [x for x in ids if len(x) < 120][:12]  # fits one 2048-token step
    packed = minilm_engine.embed(PackedBatch.from_sequences(ids))
    alone = np.concatenate([minilm_engine.embed(PackedBatch.from_sequences([x])) for x in ids])
    np.testing.assert_allclose(packed, alone, atol=2e-6)
    reordered = minilm_engine.embed(PackedBatch.from_sequences(ids[::-1]))[::-1]
    np.testing.assert_allclose(reordered, alone, atol=2e-6)


def test_engine_refuses_oversized_batches(minilm_spec):
    engine = Engine(minilm_spec, EngineConfig(token_budget=512, max_seqs=2))
    with pytest.raises(ValueError, match="at most 2"):
        engine.step(PackedBatch.from_sequences([np.ones(3, np.int32)] * 3))
    with pytest.raises(ValueError, match="token budget 512"):
        engine.step(PackedBatch.from_sequences([np.ones(256, np.int32), np.ones(257, np.int32)]))
    with pytest.raises(ValueError, match="max length"):
        engine.step(PackedBatch.from_sequences([np.ones(300, np.int32)]))
    with pytest.raises(ValueError, match="raise --token-budget"):
        Engine(minilm_spec, EngineConfig(token_budget=128))


def test_host_ring_never_clobbers_an_unread_result():
    ring = HostRing(depth=2, max_rows=4, dim=3, device=torch.device("cpu"))
    results = [ring.submit(torch.full((2, 3), float(i))) for i in range(5)]  # wraps the ring twice
    for i, lazy in enumerate(results):
        assert lazy.done()
        np.testing.assert_array_equal(lazy.result(), np.full((2, 3), float(i), dtype=np.float32))
    first = ring.submit(torch.ones(1, 3))
    value = first.result()
    ring.submit(torch.zeros(1, 3))
    ring.submit(torch.zeros(1, 3))  # reuses first's slot
    np.testing.assert_array_equal(first.result(), value)  # a read result is a copy, unaffected
    with pytest.raises(ValueError, match="hold 4"):
        ring.submit(torch.zeros(5, 3))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_sdpa_attention_matches_dense_masked_reference(causal, kv_heads):
    """The CPU backend == one dense attention over the packed tokens with a block-diagonal mask."""
    from petal.engine.inputs import InputLayout, fill_inputs, make_context
    from petal.engine.layers.attention import SdpaAttention, attention

    torch.manual_seed(0)
    lengths = [5, 1, 12, 7]
    batch = PackedBatch.from_sequences([np.ones(n, np.int32) for n in lengths])
    layout = InputLayout(batch.num_tokens + 6, batch.num_seqs + 2)  # padded, as a graph bucket would be
    host = np.zeros(layout.size, np.int32)
    fill_inputs(host, layout, batch)
    buffer = torch.from_numpy(host)
    ctx = make_context(buffer, buffer[layout.slices()["cu_seqlens"]], layout, 12, SdpaAttention(causal, 8**-0.5),
                       padded=True)
    q = torch.randn(layout.num_tokens, 4, 8)
    k = torch.randn(layout.num_tokens, kv_heads, 8)
    v = torch.randn(layout.num_tokens, kv_heads, 8)
    out = attention(q, k, v, ctx)
    seq = torch.from_numpy(host[layout.slices()["token_seq_ids"]]).long()
    allowed = seq[:, None] == seq[None, :]
    if causal:
        allowed &= torch.ones_like(allowed).tril()
    kr, vr = k.repeat_interleave(4 // kv_heads, 1), v.repeat_interleave(4 // kv_heads, 1)
    scores = torch.einsum("qhd,khd->hqk", q, kr) * 8**-0.5
    ref = torch.einsum("hqk,khd->qhd", scores.masked_fill(~allowed, float("-inf")).softmax(-1), vr)
    real = batch.num_tokens
    torch.testing.assert_close(out[:real], ref[:real], rtol=1e-5, atol=1e-5)


def test_kernel_warmup_is_nothing_on_the_cpu(minilm_spec):
    from petal.engine.layers.warmup import start_warmup

    assert start_warmup(minilm_spec.config, torch.float32, torch.device("cpu")) is None
    assert start_warmup(minilm_spec.config, torch.bfloat16, torch.device("cpu")) is None


@pytest.mark.parametrize(("architecture", "act", "dtype", "gemm", "gelu"), [
    ("bert", "gelu", torch.bfloat16, True, True),  # erf GELU: tanh's difference is under bf16's rounding
    ("xlm-roberta", "gelu", torch.bfloat16, True, True),
    ("bert", "gelu", torch.float16, True, False),  # ... but not under float16's: the GELU stays a kernel
    ("bert", "gelu_new", torch.float16, True, True),  # the tanh GELU itself
    ("bert", "relu", torch.bfloat16, True, False),
    ("qwen3", "silu", torch.bfloat16, True, False),  # residual adds in the O and down GEMMs
])
def test_gemm_epilogues_are_chosen_by_family_activation_and_dtype(architecture, act, dtype, gemm, gelu):
    """What ``SmallBatchKernels`` turns on for a CUDA engine (decided without touching a GPU), and nothing on
    the CPU or with ``gemm_epilogues=False``."""
    from dataclasses import replace

    from petal.engine.config import ModelConfig
    from petal.engine.small_batch import SmallBatchKernels

    model = ModelConfig(architecture=architecture, vocab_size=100, hidden_size=64, num_layers=1, num_heads=2,
                        num_kv_heads=2, head_dim=32, intermediate_size=128, max_position_embeddings=64,
                        norm_eps=1e-12, hidden_act=act, causal=False)
    if architecture == "qwen3":  # with attention biases, the O projection's bias keeps the fused add + norm
        biased = replace(model, extra=(("attention_bias", True),))
        assert not SmallBatchKernels.for_engine(EngineConfig(device="cuda", dtype="bfloat16"), biased,
                                                torch.device("cuda"), dtype).gemm_epilogues
    config = EngineConfig(device="cuda", dtype="bfloat16")
    chosen = SmallBatchKernels.for_engine(config, model, torch.device("cuda"), dtype)
    assert (chosen.gemm_epilogues, chosen.gelu_epilogue) == (gemm, gelu)
    off = SmallBatchKernels.for_engine(replace(config, gemm_epilogues=False), model, torch.device("cuda"), dtype)
    assert not off.gemm_epilogues and not off.gelu_epilogue
    cpu = SmallBatchKernels.for_engine(config, model, torch.device("cpu"), torch.float32)
    assert not cpu.gemm_epilogues and not cpu.gelu_epilogue


def test_attention_inside_o_is_marked_for_the_buckets_whose_tiles_have_it():
    """``SmallBatchKernels.apply``: the attention runs inside the O projection only in skinny buckets with
    ``attention_o`` tiles (the 16-token one), and in none when the option or the skinny layers are off."""
    from types import SimpleNamespace

    from petal.engine.layers.skinny_linear import BUCKET_TILES
    from petal.engine.small_batch import SmallBatchKernels

    with_tiles = {bucket for bucket, tiles in BUCKET_TILES.items() if tiles.attention_o is not None}
    assert with_tiles == {16}
    for in_o, skinny in ((True, 128), (False, 128), (True, 0)):
        kernels = SmallBatchKernels(128, 32, skinny, pdl=True, attention_in_o=in_o)
        for bucket in (16, 32, 64, 128, 256):
            ctx = SimpleNamespace()
            kernels.apply(ctx, bucket)  # type: ignore[arg-type]
            assert ctx.attention_in_o == (in_o and bucket <= skinny and bucket in with_tiles), (in_o, skinny, bucket)
            assert ctx.skinny_layers == (bucket <= skinny)


def test_skinny_tiles_take_shallower_k_steps_where_the_tuned_ones_do_not_divide_a_width():
    """The 256-deep K steps tuned on pplx-embed-0.6b's widths (1024 / 2048 / 3072) stay for models whose widths
    they divide; a kernel whose K they do not divide (a q_size of 14 x 64, an intermediate of 1408) takes
    128-deep steps instead of the model losing the skinny path; a width even those do not divide still does."""
    from petal.engine.layers.skinny_linear import BUCKET_TILES, LayerSizes, fits, layer_tiles

    pplx = LayerSizes(1024, 2048, 3072)
    assert fits(1024, 2048, 3072)
    assert all(layer_tiles(bucket, pplx) == tiles for bucket, tiles in BUCKET_TILES.items())
    assert any(t.block_k == 256 for tiles in BUCKET_TILES.values() for t in (tiles.qkv, tiles.o, tiles.down))
    other = LayerSizes(1024, 896, 1408)
    assert fits(other.hidden_size, other.q_size, other.intermediate_size)
    changed = 0
    for bucket, tuned in BUCKET_TILES.items():
        tiles = layer_tiles(bucket, other)
        for role, k in (("qkv", 1024), ("o", 896), ("gate_up", 1024), ("down", 1408)):
            got, want = getattr(tiles, role), getattr(tuned, role)
            assert k % got.block_k == 0, (bucket, role, got)
            if k % want.block_k == 0:
                assert got == want, (bucket, role)  # a step that divides is kept
            else:
                assert got.block_k == 128 and (got.block_m, got.block_n, got.split_k) == \
                    (want.block_m, want.block_n, want.split_k), (bucket, role)
                changed += 1
        assert fits(other.hidden_size, other.q_size, other.intermediate_size, tiles)
    assert changed >= 3  # O at 32 and 64 rows, down at 128
    assert not fits(1024, 960, 3072)  # 15 x 64: not a multiple of 128
