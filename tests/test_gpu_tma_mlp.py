"""Large buckets' gate/up + SwiGLU TMA kernel (engine/layers/tma_mlp.py; GPU host, sm90+, skipped elsewhere):
the kernel against cuBLAS + ``silu_and_mul`` and a float32 reference (ragged row counts, both 16-bit dtypes),
and the engine with it against the engine without it and Hugging Face transformers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from petal.engine.batch import PackedBatch
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine
from tests.parity import cosine_rows, hf_embed, hf_model, native_from_hf, petal_embed, random_docs
from tests.test_gpu import TINY

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _needs_tma():
    from petal.engine.layers.tma_mlp import tma_available

    if not tma_available(torch.cuda.current_device()):
        pytest.skip("needs sm90+ and Triton's tensor descriptors")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_tokens", [1, 100, 128, 1000, 2048, 4100])
@pytest.mark.parametrize(("hidden", "inter"), [(1024, 3072), (256, 512)])
def test_tma_gate_up_silu_matches_cublas_and_reference(num_tokens, hidden, inter, dtype):
    from petal.engine.layers.activation import silu_and_mul
    from petal.engine.layers.tma_mlp import gate_up_silu_tma

    torch.manual_seed(num_tokens + hidden)
    x = torch.randn(num_tokens, hidden, device=CUDA, dtype=dtype)
    w = torch.randn(2 * inter, hidden, device=CUDA, dtype=dtype) * hidden**-0.5
    gate, up = F.linear(x.float(), w.float()).chunk(2, dim=-1)
    ref = F.silu(gate) * up
    unfused = silu_and_mul(F.linear(x, w)).float()
    out = gate_up_silu_tma(x, w)
    assert out.shape == (num_tokens, inter) and out.dtype == dtype
    assert torch.isfinite(out).all()
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2
    # the same roundings as the unfused path: only the GEMMs' summation order differs
    assert float((out.float() - unfused).norm() / unfused.norm()) < 2e-3


def test_tma_gate_up_silu_reads_a_row_slice():
    """A view of a larger buffer's first rows (as a graph bucket's padded buffer is sliced) is read, not copied."""
    from petal.engine.layers.activation import silu_and_mul
    from petal.engine.layers.tma_mlp import gate_up_silu_tma

    torch.manual_seed(5)
    buffer = torch.randn(4096, 1024, device=CUDA, dtype=torch.bfloat16)
    w = torch.randn(2 * 3072, 1024, device=CUDA, dtype=torch.bfloat16) * 1024**-0.5
    x = buffer[:2500]
    out = gate_up_silu_tma(x, w)
    unfused = silu_and_mul(F.linear(x, w)).float()
    assert float((out.float() - unfused).norm() / unfused.norm()) < 2e-3


@pytest.mark.parametrize("family", ["qwen3-causal", "qwen3-bidirectional"])
def test_engine_with_the_tma_kernel_equals_the_engine_without(family):
    """Buckets from 512 tokens run the TMA kernel (eager, capture, replay of each), smaller ones do not; the
    vectors equal an engine without it and Hugging Face transformers."""
    shape = TINY[family]
    hf = hf_model(shape, CUDA, torch.bfloat16, seed=31)
    spec, model = native_from_hf(shape, hf, CUDA, torch.bfloat16)
    common = {"device": "cuda", "dtype": "bfloat16", "token_budget": 4096, "max_seqs": 64}
    tma = Engine(spec, EngineConfig(**common, tma_mlp_tokens=512), model=model)
    plain = Engine(spec, EngineConfig(**common, tma_mlp_tokens=0), model=model)
    assert tma.small.tma_mlp_tokens == 512 and plain.small.tma_mlp_tokens == 0
    rng = np.random.default_rng(8)
    for num_seqs, high in ((2, 200), (6, 300), (12, 500), (30, 250), (9, 500)):
        docs = random_docs(rng.integers(1, high, num_seqs), 30000, seed=int(rng.integers(1 << 30)))
        batch = PackedBatch.from_sequences(docs)
        for _ in range(3):  # eager, capture, replay
            a = tma.step(batch).result()
            b = plain.step(batch).result()
            assert cosine_rows(a, b).min() > 0.999, (batch.num_tokens, cosine_rows(a, b).min())
    ref = hf_embed(hf, shape, docs, batch_size=8, bidirectional=family == "qwen3-bidirectional")
    assert cosine_rows(petal_embed(tma, docs), ref).min() >= 0.995
    assert tma.graphs is not None
    ran = {bucket: state.ctx.tma_mlp for bucket, state in tma.graphs.states.items()}
    assert any(ran.values()) and not all(ran.values()), ran
    assert ran == {bucket: bucket >= 512 for bucket in ran}
