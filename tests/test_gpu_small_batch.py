"""The small-batch path on CUDA (engine/small_batch.py; run on the GPU host, skipped without CUDA):
the fused attention and gate/up + SwiGLU kernels against float32 references on padded bucket
layouts, and the engine with the path on against the engine with it off and against Hugging Face
transformers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from petal.engine.batch import PackedBatch, token_bucket
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine
from petal.engine.graphs import seq_capacity
from petal.engine.inputs import InputLayout, fill_inputs
from tests.parity import cosine_rows, hf_embed, hf_model, native_from_hf, petal_embed, random_docs
from tests.test_gpu import TINY

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
OFF = {"small_attention_tokens": 0, "fused_mlp_tokens": 0, "skinny_layer_tokens": 0}


def bucket_inputs(lengths: list[int], padded: bool) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(real tokens, token_seq_ids, cu_seqlens, positions) of a graph bucket's layout (or the exact one)."""
    batch = PackedBatch.from_sequences(random_docs(np.array(lengths), 30000, seed=sum(lengths)))
    if padded:
        bucket = token_bucket(batch.num_tokens)
        layout = InputLayout(bucket, seq_capacity(bucket, 64))
    else:
        layout = InputLayout(batch.num_tokens, batch.num_seqs)
    host = np.zeros(layout.size, dtype=np.int32)
    fill_inputs(host, layout, batch)
    buf = torch.from_numpy(host).to(CUDA)
    sl = layout.slices()
    return batch.num_tokens, buf[sl["token_seq_ids"]], buf[sl["cu_seqlens"]], buf[sl["positions"]]


def attention_reference(qkv, seq_ids, positions, hq, hk, d, causal, table, weights, eps):
    """float32 attention of each token over its own sequence, after the unfused path's q/k norm + RoPE."""
    from petal.engine.layers.rotary import apply_rotary

    t = qkv.shape[0]
    q, k, v = qkv.float().split([hq * d, hk * d, hk * d], -1)
    q, k, v = q.reshape(t, hq, d), k.reshape(t, hk, d), v.reshape(t, hk, d)
    if weights is not None:
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) * weights[0].float()
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps) * weights[1].float()
        gathered = table[positions.long()]
        q, k = apply_rotary(q, k, gathered[:, None, : d // 2], gathered[:, None, d // 2 :])
    q, k = q.to(qkv.dtype).float(), k.to(qkv.dtype).float()
    k, v = k.repeat_interleave(hq // hk, 1), v.repeat_interleave(hq // hk, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * d**-0.5
    mask = seq_ids[:, None] == seq_ids[None, :]
    if causal:
        mask &= torch.ones(t, t, dtype=torch.bool, device=qkv.device).tril()
    return torch.einsum("hqk,khd->qhd", scores.masked_fill(~mask, float("-inf")).softmax(-1), v)


@pytest.mark.parametrize(("hq", "hk", "d", "causal", "rope"), [
    (16, 8, 128, False, True), (16, 8, 128, True, True), (4, 2, 64, True, True), (16, 16, 64, False, False),
    (12, 12, 32, False, False)])
@pytest.mark.parametrize(("lengths", "padded"), [
    ([16], True), ([1], True), ([128], True), ([5, 1, 60, 3, 90, 2, 30, 7, 12], True), ([200, 40], True),
    ([17, 3], False), ([1], False)])
def test_small_attention_matches_reference(hq, hk, d, causal, rope, lengths, padded):
    from petal.engine.layers.rotary import RotaryEmbedding
    from petal.engine.layers.small_attention import small_attention

    real, seq_ids, cu, positions = bucket_inputs(lengths, padded)
    t = seq_ids.shape[0]
    torch.manual_seed(t + hq)
    qkv = torch.randn(t, (hq + 2 * hk) * d, device=CUDA, dtype=torch.bfloat16) * 2
    table = RotaryEmbedding(d, 1024, 1e6).cos_sin(CUDA)
    weights = (torch.rand(2, d, device=CUDA) + 0.5).to(torch.bfloat16) if rope else None
    before = qkv.clone()
    ref = attention_reference(qkv, seq_ids, positions, hq, hk, d, causal, table, weights, 1e-6)
    # whole=None: one key block for steps of up to block_n (64) slots, the blocked loop above; False: always blocked
    for block_m, whole in ((16, None), (64, None), (16, False), (32, True if t <= 64 else None)):
        out = small_attention(qkv, seq_ids, cu, num_heads=hq, num_kv_heads=hk, head_dim=d, causal=causal,
                              scale=d**-0.5, positions=positions if rope else None, rope_table=table if rope else None,
                              qk_norm_weights=weights, eps=1e-6, block_m=block_m, whole=whole)
        assert out.shape == (t, hq, d) and torch.isfinite(out).all()
        err = float((out[:real].float() - ref[:real]).norm() / ref[:real].norm())
        assert err < 1e-2, (block_m, whole, err)
    assert torch.equal(qkv, before)  # the projection is read, never written


@pytest.mark.parametrize("num_tokens", [1, 16, 64, 100, 128, 256])
@pytest.mark.parametrize(("hidden", "inter"), [(1024, 3072), (256, 512)])
def test_gate_up_silu_matches_reference(num_tokens, hidden, inter):
    from petal.engine.layers.fused_mlp import gate_up_silu

    torch.manual_seed(num_tokens)
    x = torch.randn(num_tokens, hidden, device=CUDA, dtype=torch.bfloat16)
    w = torch.randn(2 * inter, hidden, device=CUDA, dtype=torch.bfloat16) * hidden**-0.5
    gate, up = F.linear(x.float(), w.float()).chunk(2, dim=-1)
    ref = F.silu(gate) * up
    out = gate_up_silu(x, w)
    assert out.shape == (num_tokens, inter)
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2


def rms_reference(x, g, eps):
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * g.float()


@pytest.mark.parametrize("row_blocks", ["bucket", "many"])
@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("num_tokens", [1, 5, 16, 17, 32, 33, 64, 100, 128])
@pytest.mark.parametrize(("hidden", "width", "inter"), [(1024, 4096, 3072), (256, 512, 512)])
def test_skinny_kernels_match_reference(num_tokens, hidden, width, inter, pdl, row_blocks):
    """norm_linear (plain and SwiGLU) and the split-K linear_add against float32, eager and as graph replays,
    with and without programmatic dependent launch (the kernels chained as a layer chains them), with the
    bucket's tiles and with 16-row tiles (every row block its own programs, split-K counters and sums)."""
    from petal.engine.layers.skinny_linear import GemmTiles, linear_add, norm_input, norm_linear

    tiles = None if row_blocks == "bucket" else GemmTiles(block_m=16, block_n=32, block_k=64, split_k=4)
    if pdl and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm90+")
    torch.manual_seed(num_tokens + hidden)
    eps = 1e-6
    x = torch.randn(num_tokens, hidden, device=CUDA, dtype=torch.bfloat16) * 3
    g = (torch.rand(hidden, device=CUDA) + 0.5).to(torch.bfloat16)
    w = torch.randn(width, hidden, device=CUDA, dtype=torch.bfloat16) * hidden**-0.5
    wgu = torch.randn(2 * inter, hidden, device=CUDA, dtype=torch.bfloat16) * hidden**-0.5
    wd = torch.randn(hidden, inter, device=CUDA, dtype=torch.bfloat16) * inter**-0.5
    ref_lin = rms_reference(x, g, eps) @ w.float().T
    gu = rms_reference(x, g, eps) @ wgu.float().T
    ref_act = F.silu(gu[:, :inter]) * gu[:, inter:]
    outs = {}

    def chain():
        first = norm_input(x, g)
        outs["lin"] = norm_linear(first, eps, w, pdl=pdl, tiles=tiles)
        outs["act"] = norm_linear(first, eps, wgu, swiglu=True, pdl=pdl, tiles=tiles)
        outs["add"], nxt = linear_add(outs["act"], wd, x, norm_weight=g, pdl=pdl, tiles=tiles)
        outs["scaled"] = nxt.hg
        outs["lin2"] = norm_linear(nxt, eps, w, pdl=pdl, tiles=tiles)  # from the sums of squares linear_add wrote
        outs["inplace"] = x.clone()
        _, none = linear_add(outs["act"], wd, outs["inplace"], out=outs["inplace"], pdl=pdl, tiles=tiles)
        assert none is None

    chain()
    torch.cuda.synchronize()
    eager = {key: value.clone() for key, value in outs.items()}
    ref_add = x.float() + eager["act"].float() @ wd.float().T
    ref_scaled = eager["add"].float() * g.float()
    ref_lin2 = rms_reference(eager["add"], g, eps) @ w.float().T
    for key, ref in (("lin", ref_lin), ("act", ref_act), ("add", ref_add), ("inplace", ref_add),
                     ("scaled", ref_scaled), ("lin2", ref_lin2)):
        err = float((eager[key].float() - ref).norm() / ref.norm())
        assert err < 1e-2, (key, err)
    assert torch.equal(eager["add"], eager["inplace"])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    for _ in range(3):  # the split-K counters are back at 0 after every run
        graph.replay()
        torch.cuda.synchronize()
        for key, value in eager.items():
            assert torch.equal(outs[key], value), key


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize(("hq", "hk", "d", "hidden", "causal"), [
    (16, 8, 128, 1024, False), (16, 8, 128, 1024, True), (4, 2, 64, 256, True), (12, 12, 32, 512, False)])
@pytest.mark.parametrize(("lengths", "padded"), [([16], True), ([1], True), ([5, 1, 9], True), ([30], True),
                                                 ([60], True), ([3, 20, 7, 30], True), ([11], False)])
def test_attention_add_equals_the_attention_kernel_then_linear_add(hq, hk, d, hidden, causal, lengths, padded, pdl):
    """The attention inside the O projection (``attention_add``, steps of up to 64 slots) gives what the
    attention kernel followed by ``linear_add`` gives with the same tiles, and float32; graph replays equal eager."""
    from petal.engine.layers.rotary import RotaryEmbedding
    from petal.engine.layers.skinny_linear import GemmTiles, attention_add, linear_add
    from petal.engine.layers.small_attention import SmallAttention, attend

    if pdl and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm90+")
    real, seq_ids, cu, positions = bucket_inputs(lengths, padded)
    t = seq_ids.shape[0]
    torch.manual_seed(t + hq + d)
    qkv = torch.randn(t, (hq + 2 * hk) * d, device=CUDA, dtype=torch.bfloat16) * 2
    table = RotaryEmbedding(d, 1024, 1e6).cos_sin(CUDA)
    qk_weights = (torch.rand(2, d, device=CUDA) + 0.5).to(torch.bfloat16)
    wo = torch.randn(hidden, hq * d, device=CUDA, dtype=torch.bfloat16) * (hq * d) ** -0.5
    g = (torch.rand(hidden, device=CUDA) + 0.5).to(torch.bfloat16)
    res = torch.randn(t, hidden, device=CUDA, dtype=torch.bfloat16)
    attention = SmallAttention(seq_ids, cu, hq, hk, d, causal, d**-0.5, positions, table, qk_weights, 1e-6)
    # the engine's tiles (16-slot bucket) and the same split over heads for 32 and 64 slots
    tiles = GemmTiles(block_m=max(16, 1 << (t - 1).bit_length()), block_n=32, split_k=8)
    ref_attn = attention_reference(qkv, seq_ids, positions, hq, hk, d, causal, table, qk_weights, 1e-6)
    ref = res.float() + ref_attn.reshape(t, hq * d).to(torch.bfloat16).float() @ wo.float().T
    apart, apart_next = linear_add(attend(qkv, attention).view(t, hq * d), wo, res.clone(), norm_weight=g, tiles=tiles)
    outs = {}

    def run():
        outs["out"] = res.clone()
        outs["sum"], nxt = attention_add(qkv, attention, wo, outs["out"], out=outs["out"], norm_weight=g, pdl=pdl,
                                         tiles=tiles)
        outs["hg"], outs["sumsq"] = nxt.hg, nxt.sumsq

    run()
    torch.cuda.synchronize()
    eager = {key: value.clone() for key, value in outs.items()}
    assert eager["sum"].data_ptr() == eager["out"].data_ptr() or torch.equal(eager["sum"], eager["out"])
    err = float((eager["sum"][:real].float() - ref[:real]).norm() / ref[:real].norm())
    assert err < 1e-2, err
    assert not torch.equal(eager["sum"][:real], res[:real])  # the product was added
    torch.testing.assert_close(eager["sum"][:real], apart[:real], atol=3e-2, rtol=1e-2)
    torch.testing.assert_close(eager["hg"][:real], apart_next.hg[:real], atol=3e-2, rtol=1e-2)
    torch.testing.assert_close(eager["sumsq"].sum(0)[:real], apart_next.sumsq.sum(0)[:real], rtol=1e-2, atol=1e-2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(3):  # split-K counters back at 0 after every run
        graph.replay()
        torch.cuda.synchronize()
        for key, value in eager.items():
            assert torch.equal(outs[key], value), key


def engines(family: str, **config):
    shape = TINY[family]
    hf = hf_model(shape, CUDA, torch.bfloat16, seed=11)
    spec, model = native_from_hf(shape, hf, CUDA, torch.bfloat16)
    fast = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=4096, max_seqs=64, **config),
                  model=model)
    plain = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=4096, max_seqs=64, **OFF),
                   model=model)
    return shape, hf, fast, plain


@pytest.mark.parametrize("family", list(TINY))
def test_small_batches_equal_the_plain_engine_and_transformers(family):
    """Lone queries and a few short texts (every small bucket: eager, capture, replays) through the
    small-batch path equal the engine without it and Hugging Face transformers."""
    shape, hf, fast, plain = engines(family)
    assert fast.small.attention_tokens > 0
    rng = np.random.default_rng(12)
    batches = []
    for num_seqs, high in ((1, 16), (1, 128), (2, 60), (3, 100), (8, 40), (1, 250), (5, 200)):
        docs = random_docs(rng.integers(1, high, num_seqs), 30000, seed=int(rng.integers(1 << 30)))
        batches.extend([docs] * 3)  # eager, capture, replay of its bucket
    bidirectional = family == "qwen3-bidirectional"
    for docs in batches:
        batch = PackedBatch.from_sequences(docs)
        a = fast.step(batch).result()
        b = plain.step(batch).result()
        assert cosine_rows(a, b).min() > 0.999, (len(docs), batch.num_tokens, cosine_rows(a, b).min())
    ref = hf_embed(hf, shape, batches[-1], batch_size=8, bidirectional=bidirectional)
    assert cosine_rows(petal_embed(fast, batches[-1]), ref).min() >= 0.995
    assert fast.graphs is not None
    used = [state.ctx for bucket, state in fast.graphs.states.items() if bucket <= fast.small.attention_tokens]
    assert used and all(ctx.fused_attention for ctx in used)
    if family.startswith("qwen3"):  # buckets up to 128 tokens ran the skinny layers, larger ones did not
        assert fast.small.skinny_tokens == 128
        states = fast.graphs.states.items()
        assert all(state.ctx.skinny_layers == (bucket <= 128) for bucket, state in states)
        assert any(bucket <= 128 for bucket, _ in states) and any(bucket > 128 for bucket, _ in states)
    assert fast.stats.graph_replays > 0


@pytest.mark.parametrize(("pdl", "in_o"), [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("family", ["qwen3-causal", "qwen3-bidirectional"])
def test_skinny_layers_equal_the_plain_engine(family, pdl, in_o):
    """The skinny layer path (PDL on and off, the attention inside the O projection in the 16-token bucket or
    not; every bucket up to 128 tokens, around the fused attention, which it needs) against the engine without
    any small-batch kernel."""
    shape, hf, fast, plain = engines(family, small_attention_tokens=128, fused_mlp_tokens=0,
                                     skinny_layer_tokens=128, pdl=pdl, attention_in_o=in_o)
    assert fast.small.skinny_tokens == 128 and fast.small.pdl == (pdl and torch.cuda.get_device_capability()[0] >= 9)
    assert fast.small.attention_in_o == in_o
    rng = np.random.default_rng(21)
    for num_seqs, high in ((1, 16), (1, 32), (2, 14), (4, 8), (1, 3), (1, 128), (3, 40), (2, 60), (9, 12)):
        docs = random_docs(rng.integers(1, high, num_seqs), 30000, seed=int(rng.integers(1 << 30)))
        batch = PackedBatch.from_sequences(docs)
        for _ in range(3):  # eager, capture, replay
            a = fast.step(batch).result()
            b = plain.step(batch).result()
            assert cosine_rows(a, b).min() > 0.999, (num_seqs, cosine_rows(a, b).min())
    bidirectional = family == "qwen3-bidirectional"
    ref = hf_embed(hf, shape, docs, batch_size=8, bidirectional=bidirectional)
    assert cosine_rows(petal_embed(fast, docs), ref).min() >= 0.995
    assert fast.graphs is not None
    ran = {bucket: state.ctx.attention_in_o for bucket, state in fast.graphs.states.items()}
    assert 16 in ran and ran == {bucket: in_o and bucket == 16 for bucket in ran}


@pytest.mark.parametrize("family", ["bert", "qwen3-causal", "qwen3-bidirectional"])
def test_small_batch_graph_equals_eager_for_every_bucket(family):
    shape = TINY[family]
    hf = hf_model(shape, CUDA, torch.bfloat16, seed=13)
    spec, model = native_from_hf(shape, hf, CUDA, torch.bfloat16)
    graphs = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=4096, max_seqs=64),
                    model=model)
    eager = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=4096, max_seqs=64,
                                      cuda_graphs=False), model=model)
    rng = np.random.default_rng(14)
    for num_seqs in (1, 2, 3, 7, 15):
        for _ in range(3):
            docs = random_docs(rng.integers(1, 60, num_seqs), 30000, seed=int(rng.integers(1 << 30)))
            batch = PackedBatch.from_sequences(docs)
            a = graphs.step(batch).result()
            b = eager.step(batch).result()
            assert cosine_rows(a, b).min() > 0.999, (num_seqs, cosine_rows(a, b).min())


def test_explicit_attention_backend_is_kept():
    """``--attention flashinfer`` (or torch) is what runs: the fused attention stands in for ``auto`` only."""
    _, _, fast, _ = engines("qwen3-bidirectional", attention="flashinfer")
    assert fast.small.attention_tokens == 0
    fast.step(PackedBatch.from_sequences(random_docs(np.array([9]), 30000))).result()
