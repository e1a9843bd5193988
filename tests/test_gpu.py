"""CUDA engine (run on the GPU host; skipped without CUDA): graphs == eager for every bucket used,
packed == one at a time, engine == Hugging Face transformers with the same random weights, backends
agree, and a long mixed run with many steps in flight."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from petal.engine.batch import PackedBatch, token_bucket
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine
from tests.parity import Shape, cosine_rows, hf_embed, hf_model, native_from_hf, petal_embed, random_docs

pytestmark = pytest.mark.gpu

TINY = {
    "bert": Shape("tiny-bert", {
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30522, "hidden_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 512, "max_position_embeddings": 512,
        "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu", "pad_token_id": 0}, "mean", True, 512),
    "xlm-roberta": Shape("tiny-xlmr", {
        "architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta", "vocab_size": 30522, "hidden_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 512, "max_position_embeddings": 514,
        "type_vocab_size": 1, "pad_token_id": 1, "layer_norm_eps": 1e-5, "hidden_act": "gelu"}, "cls", True, 512),
    "qwen3-causal": Shape("tiny-qwen3", {
        "architectures": ["Qwen3Model"], "model_type": "qwen3", "vocab_size": 30522, "hidden_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "intermediate_size": 512, "max_position_embeddings": 1024, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6,
        "hidden_act": "silu"}, "last", True, 512),
}
TINY["qwen3-bidirectional"] = Shape("tiny-qwen3-bi", {**TINY["qwen3-causal"].hf_config,
                                                      "use_bidirectional_attention": True}, "mean", False, 512)

CUDA = torch.device("cuda")


def engine_pair(shape: Shape, attention: str = "auto", token_budget: int = 4096, max_seqs: int = 64):
    hf = hf_model(shape, CUDA, torch.bfloat16, seed=1)
    spec, model = native_from_hf(shape, hf, CUDA, torch.bfloat16)
    graphs = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", attention=attention, token_budget=token_budget,
                                       max_seqs=max_seqs), model=model)
    eager = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", attention=attention, token_budget=token_budget,
                                      max_seqs=max_seqs, cuda_graphs=False), model=model)
    return hf, spec, graphs, eager


def mixed_docs(n: int, seed: int, high: int = 400) -> list[np.ndarray]:
    lengths = np.random.default_rng(seed).integers(1, high, n)
    return random_docs(lengths, 30000, seed=seed)


@pytest.mark.parametrize("family", list(TINY))
def test_engine_matches_transformers(family):
    shape = TINY[family]
    hf, _, graphs, _ = engine_pair(shape)
    docs = mixed_docs(96, seed=2)
    ours = petal_embed(graphs, docs)
    ours_again = petal_embed(graphs, docs)  # second and third pass: captured graphs replay
    bidirectional = family == "qwen3-bidirectional"  # HF Qwen3 is causal unless given a 4-D mask
    ref = hf_embed(hf, shape, docs, batch_size=16, bidirectional=bidirectional)
    cos = cosine_rows(ours, ref)
    assert cos.min() >= 0.995, (family, cos.min())
    np.testing.assert_allclose(ours_again, ours, atol=2e-2)
    assert graphs.stats.graph_replays > 0 and graphs.stats.graph_captures > 0


@pytest.mark.parametrize("family", ["bert", "qwen3-causal", "qwen3-bidirectional"])
@pytest.mark.parametrize("attention", ["flashinfer", "torch"])
def test_graph_equals_eager_for_every_bucket(family, attention):
    _, _, graphs, eager = engine_pair(TINY[family], attention=attention)
    assert graphs.attention.name == attention and graphs.graphs is not None and eager.graphs is None
    rng = np.random.default_rng(3)
    hits: dict[int, int] = {}
    for num_seqs in (1, 2, 3, 7, 15, 31, 63):
        for _ in range(3):  # eager, capture, replay of this bucket
            docs = mixed_docs(num_seqs, seed=int(rng.integers(1 << 30)), high=60)
            batch = PackedBatch.from_sequences(docs)
            bucket = token_bucket(batch.num_tokens)
            hits[bucket] = hits.get(bucket, 0) + 1
            a = graphs.step(batch).result()
            b = eager.step(batch).result()
            assert np.abs(a - b).max() < 2e-2, (num_seqs, np.abs(a - b).max())
            assert cosine_rows(a, b).min() > 0.999
    assert graphs.stats.eager_steps == len(hits)  # one eager run per bucket, then capture, then replays
    assert graphs.stats.graph_captures == sum(1 for n in hits.values() if n >= 2)
    assert graphs.stats.graph_replays == sum(n - 1 for n in hits.values())


@pytest.mark.parametrize("family", ["bert", "qwen3-bidirectional"])
def test_packed_equals_one_at_a_time(family):
    _, _, graphs, _ = engine_pair(TINY[family])
    docs = mixed_docs(24, seed=4, high=150)
    for _ in range(3):  # eager, capture, replay: compare the replay
        packed = graphs.step(PackedBatch.from_sequences(docs)).result()
    alone = np.concatenate([graphs.step(PackedBatch.from_sequences([d])).result() for d in docs])
    assert cosine_rows(packed, alone).min() > 0.999


def test_attention_backends_agree():
    shape = TINY["qwen3-bidirectional"]
    hf = hf_model(shape, CUDA, torch.bfloat16, seed=5)
    docs = mixed_docs(64, seed=6)
    outs = {}
    for backend in ("flashinfer", "torch", "sdpa"):
        spec, model = native_from_hf(shape, hf, CUDA, torch.bfloat16)
        engine = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", attention=backend, token_budget=4096,
                                           max_seqs=64), model=model)
        outs[backend] = petal_embed(engine, docs)
    assert cosine_rows(outs["flashinfer"], outs["sdpa"]).min() > 0.999
    assert cosine_rows(outs["torch"], outs["sdpa"]).min() > 0.999


def test_long_mixed_run_matches_eager():
    """Many steps in flight over every bucket: the pipelined graph engine equals the eager engine."""
    _, _, graphs, eager = engine_pair(TINY["qwen3-bidirectional"], token_budget=8192, max_seqs=128)
    docs = mixed_docs(3000, seed=7, high=512)
    a = petal_embed(graphs, docs)
    b = petal_embed(eager, docs)
    assert cosine_rows(a, b).min() > 0.999
    assert graphs.stats.graph_replays > 10 * graphs.stats.graph_captures > 0


@pytest.mark.parametrize("tokens_per_doc", [5, 40, 300])
def test_steps_of_one_bucket_in_flight_keep_their_own_inputs(tokens_per_doc):
    """A bucket's inputs are filled into one pinned host buffer that the graph copies itself: steps of the same
    bucket launched back to back, none waited for, each embed their own documents (equal to eager)."""
    hf = hf_model(TINY["qwen3-bidirectional"], CUDA, torch.bfloat16, seed=1)
    spec, model = native_from_hf(TINY["qwen3-bidirectional"], hf, CUDA, torch.bfloat16)
    config = EngineConfig(device="cuda", dtype="bfloat16", token_budget=4096, max_seqs=64, steps_in_flight=8)
    graphs = Engine(spec, config, model=model)
    eager = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=4096, max_seqs=64,
                                      cuda_graphs=False), model=model)
    batches = [PackedBatch.from_sequences(random_docs(np.full(6, tokens_per_doc), 30000, seed=seed))
               for seed in range(10)]
    assert len({token_bucket(b.num_tokens) for b in batches}) == 1
    for batch in batches[:2]:  # the bucket's eager run and its capture
        graphs.step(batch).result()
    lazies = [graphs.step(batch) for batch in batches[2:]]  # 8 replays queued behind each other
    for batch, lazy in zip(batches[2:], lazies):
        assert cosine_rows(lazy.result(), eager.step(batch).result()).min() > 0.999
    assert graphs.stats.graph_replays >= 9


def test_first_embedding_is_fast_and_lazy():
    import time

    shape = TINY["qwen3-bidirectional"]
    hf = hf_model(shape, CUDA, torch.bfloat16, seed=8)
    spec, model = native_from_hf(shape, hf, CUDA, torch.bfloat16)
    started = time.perf_counter()
    engine = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=16384), model=model)
    engine.step(PackedBatch.from_sequences(mixed_docs(4, seed=9))).result()
    assert time.perf_counter() - started < 2.0
    assert engine.stats.graph_captures == 0 and engine.stats.eager_steps == 1  # nothing captured up front


def test_fused_qk_norm_rope_matches_torch():
    from petal.engine.layers.norm import RMSNorm
    from petal.engine.layers.rotary import RotaryEmbedding, apply_rotary
    from petal.engine.layers.triton_kernels import qk_norm_rope_

    torch.manual_seed(0)
    num_tokens, hq, hk, d = 300, 16, 8, 128
    qkv = torch.randn(num_tokens, (hq + 2 * hk) * d, device=CUDA, dtype=torch.bfloat16) * 3
    positions = torch.randint(0, 512, (num_tokens,), device=CUDA, dtype=torch.int32)
    q_norm, k_norm = RMSNorm(d, 1e-6).to(CUDA), RMSNorm(d, 1e-6).to(CUDA)
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5)
        k_norm.weight.uniform_(0.5, 1.5)
    rope = RotaryEmbedding(d, 1024, 1e6).tables(positions)
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    q_ref = q_norm._norm(q.reshape(num_tokens, hq, d))
    k_ref = k_norm._norm(k.reshape(num_tokens, hk, d))
    q_ref, k_ref = apply_rotary(q_ref, k_ref, *rope.cos_sin(torch.bfloat16))
    v_before = v.clone()
    fused = qkv.clone()
    weights = torch.stack([q_norm.weight, k_norm.weight]).to(torch.bfloat16).contiguous()
    qk_norm_rope_(fused, positions, rope.table, weights, 1e-6, hq, hk, d)
    fq, fk, fv = fused.split([hq * d, hk * d, hk * d], dim=-1)
    torch.testing.assert_close(fq.view(num_tokens, hq, d).float(), q_ref.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(fk.view(num_tokens, hk, d).float(), k_ref.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(fv, v_before)  # v untouched


def test_fused_add_layer_norm_matches_torch():
    from petal.engine.layers.triton_kernels import add_layer_norm

    torch.manual_seed(1)
    for hidden in (384, 1024):
        x = torch.randn(257, hidden, device=CUDA, dtype=torch.bfloat16)
        r = torch.randn(257, hidden, device=CUDA, dtype=torch.bfloat16)
        w = torch.rand(hidden, device=CUDA, dtype=torch.bfloat16) + 0.5
        b = torch.randn(hidden, device=CUDA, dtype=torch.bfloat16)
        ref = torch.nn.functional.layer_norm(x + r, (hidden,), w, b, 1e-12)
        torch.testing.assert_close(add_layer_norm(x, r, w, b, 1e-12), ref, rtol=2e-2, atol=2e-2)
        row = torch.randn(hidden, device=CUDA, dtype=torch.bfloat16)  # one row added to every row: a bias
        ref = torch.nn.functional.layer_norm(x + row, (hidden,), w, b, 1e-12)
        torch.testing.assert_close(add_layer_norm(x, row, w, b, 1e-12), ref, rtol=2e-2, atol=2e-2)


def test_gemm_epilogues_match_fp32_references():
    """The up projection with bias + GELU in cuBLASLt's epilogue is the tanh GELU of the fp32 product
    (rounded once); the residual added by the GEMM is the fp32 sum."""
    from petal.engine.layers.linear import Linear, linear_gelu, linear_into_

    torch.manual_seed(2)
    for rows, hidden, inter in ((1, 256, 512), (37, 384, 1536), (1000, 1024, 4096)):
        up = Linear(hidden, inter, device=CUDA, dtype=torch.bfloat16).requires_grad_(False)
        down = Linear(inter, hidden, device=CUDA, dtype=torch.bfloat16).requires_grad_(False)
        for layer in (up, down):
            layer.weight.copy_(torch.randn_like(layer.weight) * layer.in_features**-0.5)
            layer.bias.copy_(torch.randn_like(layer.bias) * 0.1)
        x = torch.randn(rows, hidden, device=CUDA, dtype=torch.bfloat16)
        pre = x.float() @ up.weight.float().t() + up.bias.float()
        got = linear_gelu(x, up)
        assert got.dtype == torch.bfloat16 and got.shape == (rows, inter)
        torch.testing.assert_close(got.float(), torch.nn.functional.gelu(pre, approximate="tanh"),
                                   rtol=1.6e-2, atol=2e-3)
        act = torch.randn(rows, inter, device=CUDA, dtype=torch.bfloat16)
        residual = torch.randn(rows, hidden, device=CUDA, dtype=torch.bfloat16)
        want = act.float() @ down.weight.float().t() + residual.float()
        out = linear_into_(act, down, residual)
        assert out.data_ptr() == residual.data_ptr()  # in place, as the engine relies on
        torch.testing.assert_close(out.float(), want, rtol=1.6e-2, atol=2e-2)


@pytest.mark.parametrize(("family", "act"), [("bert", "gelu"), ("bert", "gelu_new"), ("bert", "relu"),
                                             ("xlm-roberta", "gelu"), ("xlm-roberta", "relu"),
                                             ("qwen3-causal", "silu"), ("qwen3-bidirectional", "silu")])
def test_gemm_epilogues_match_the_unfused_engine_and_transformers(family, act):
    """Layers with the residual adds in the O and down GEMMs (and a BERT GELU in the up projection's epilogue)
    give the vectors of the unfused engine and of Hugging Face (graphs and eager, every bucket used)."""
    base = TINY[family]
    shape = Shape(f"{base.name}-{act}", {**base.hf_config, "hidden_act": act}, base.pooling, base.normalize,
                  base.max_length)
    hf = hf_model(shape, CUDA, torch.bfloat16, seed=4)
    with torch.no_grad():  # Hugging Face initialises biases to 0; checkpoints' are not
        for name, param in hf.named_parameters():
            if name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    spec, model = native_from_hf(shape, hf, CUDA, torch.bfloat16)
    docs = mixed_docs(80, seed=7) + mixed_docs(6, seed=8, high=20)
    outs = {}
    for on in (False, True):
        for graphs in (True, False):
            engine = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=4096, max_seqs=64,
                                               cuda_graphs=graphs, gemm_epilogues=on), model=model)
            assert engine.small.gemm_epilogues == on
            assert engine.small.gelu_epilogue == (on and act.startswith("gelu"))
            petal_embed(engine, docs)  # eager / capture
            outs[on, graphs] = petal_embed(engine, docs)
    ref = hf_embed(hf, shape, docs, batch_size=16, bidirectional=family == "qwen3-bidirectional")
    for key, out in outs.items():
        assert cosine_rows(out, outs[False, False]).min() > 0.9995, key
        assert cosine_rows(out, ref).min() >= 0.995, key
    # the same weights through the unfused path differ: the test sees the fused kernels run
    assert not np.array_equal(outs[True, True], outs[False, True])


# The warm-up pays Triton's one-time start-up (pplx-embed-0.6b's first embedding: 2.6 s -> 0.7 s, cold cache).
# Qwen3's q/k norm + RoPE kernel reads ``positions``, a view into the packed input buffer: its section
# starts 64-byte aligned (engine/inputs.py), so the model's call is the warmed variant.
@pytest.mark.parametrize("family", ["bert", "qwen3-bidirectional"])
def test_kernel_warmup_compiles_what_the_model_runs(family, tmp_path, monkeypatch):
    """The warm-up's dummy call leaves the very kernel the model launches in Triton's cache: after it,
    the first step compiles nothing new (a fresh cache directory shows every compile)."""
    import os

    from petal.engine.layers import triton_kernels
    from petal.engine.models import model_class_for

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    import importlib

    from petal.engine.layers import skinny_linear, small_attention, triton_attention, triton_skinny, warmup
    from petal.engine.small_batch import SmallBatchKernels

    monkeypatch.setattr(warmup, "_warmups", {})
    # fresh JIT objects: nothing compiled in memory yet
    for factory in (triton_kernels._kernel, triton_kernels._add_ln_kernel, triton_kernels.gate_up_silu_kernel,
                    small_attention._kernel, skinny_linear._kernels):
        factory.cache_clear()
    importlib.reload(triton_attention)
    importlib.reload(triton_skinny)
    shape = TINY[family]
    config = model_class_for(shape.hf_config).config_from_hf(shape.hf_config)
    engine_config = EngineConfig(device="cuda", dtype="bfloat16", token_budget=4096)
    small = SmallBatchKernels.for_engine(engine_config, config, CUDA, torch.bfloat16)  # as the engine decides
    thread = warmup.start_warmup(config, torch.bfloat16, CUDA, small.skinny_tokens, small.skinny_options())
    assert thread is not None
    assert warmup.start_warmup(config, torch.bfloat16, CUDA, small.skinny_tokens,
                               small.skinny_options()) is thread  # idempotent
    thread.join()
    compiled = sorted(os.listdir(tmp_path / "triton"))
    assert compiled  # the warm-up compiled something
    hf = hf_model(shape, CUDA, torch.bfloat16, seed=3)
    spec, model = native_from_hf(shape, hf, CUDA, torch.bfloat16)
    engine = Engine(spec, engine_config, model=model)
    engine.step(PackedBatch.from_sequences(mixed_docs(5, seed=4))).result()  # a large bucket
    engine.step(PackedBatch.from_sequences(mixed_docs(2, seed=5, high=30))).result()  # a small one
    engine.step(PackedBatch.from_sequences(mixed_docs(1, seed=6, high=12))).result()  # the skinny layers' bucket
    assert sorted(os.listdir(tmp_path / "triton")) == compiled  # the model's kernels were the warmed ones
    assert engine.stats.kernel_warmup_wait_s >= 0


@pytest.mark.parametrize("file_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["bert", "qwen3-bidirectional"])
def test_streamed_load_equals_the_in_memory_load(family, file_dtype, tmp_path):
    """The CUDA streaming loader (pinned ring, reader threads, casts and fusions on the device) gives the
    very tensors of the in-memory mapping; tiny chunks and 3 slots make the ring wrap many times."""
    from petal.engine.loader import inspect_model, load_model
    from petal.engine.models.stream import Spans, StreamSettings
    from tests.parity import save_model_dir
    from tests.tiny_models import write_word_tokenizer

    shape = TINY[family]
    hf = hf_model(shape, CUDA, file_dtype, seed=7)
    (tmp_path / "tokenizer").mkdir()
    write_word_tokenizer(tmp_path / "tokenizer", None)  # any tokenizer.json: only the weights are compared
    spec = inspect_model(save_model_dir(shape, hf, tmp_path / "tokenizer", tmp_path / "model"))
    _, expected = native_from_hf(shape, hf, CUDA, torch.bfloat16)
    for settings in (StreamSettings(), StreamSettings(chunk_bytes=4096, slots=3, readers=2)):
        spans = Spans()
        streamed = load_model(spec, CUDA, torch.bfloat16, stream=settings, spans=spans)
        assert "readers: pread" in spans.seconds
        reference = dict(expected.named_parameters())
        for name, tensor in streamed.named_parameters():
            assert tensor.device.type == "cuda" and tensor.dtype == torch.bfloat16
            assert torch.equal(tensor, reference[name]), name
