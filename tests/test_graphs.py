"""The lazy-capture state machine and bucket padding, on the CPU with a stand-in for CUDA graphs.

The stand-in records the captured function and re-runs it on replay, so the same padded buffers,
zero-length sequence slots and dummy padding row are exercised as on CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from petal.engine.batch import PackedBatch, token_bucket
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine
from petal.engine.forward import forward_pooled
from petal.engine.graphs import LazyGraphRunner, seq_capacity
from petal.engine.inputs import InputLayout, fill_inputs


class FakeGraph:
    def __init__(self, fn):
        self.fn = fn
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.fn()


@pytest.fixture(scope="module")
def tiny_engine(tiny_bert_dir):
    from petal.engine.loader import inspect_model

    return Engine(inspect_model(tiny_bert_dir), EngineConfig(token_budget=1536, max_seqs=32))


def make_runner(engine, captured):
    def capture(fn):
        graph = FakeGraph(fn)
        captured.append(graph)
        return graph

    def forward(ctx):
        return forward_pooled(engine.model, engine.pooling, ctx.input_ids, ctx.positions, ctx)

    cfg = engine.config
    return LazyGraphRunner(token_budget=cfg.token_budget, max_seqs=cfg.max_seqs, max_length=engine.pooling.max_length,
                           dim=engine.dim, device=torch.device("cpu"), attention=engine.attention, forward=forward,
                           capture=capture)


def random_batch(rng, num_seqs, max_len=48):
    lengths = rng.integers(1, max_len, num_seqs)
    return PackedBatch.from_sequences([rng.integers(1000, 20000, n).astype(np.int32) for n in lengths])


def test_eager_then_capture_then_replay_per_bucket(tiny_engine):
    captured: list[FakeGraph] = []
    runner = make_runner(tiny_engine, captured)
    rng = np.random.default_rng(0)
    a = PackedBatch.from_sequences([np.arange(1000, 1040, dtype=np.int32)])  # 40 tokens -> bucket 64
    states = []
    for _ in range(4):
        runner.run(a)
        states.append((runner.eager_runs, runner.captures, runner.replays))
    assert states == [(1, 0, 0), (1, 1, 1), (1, 1, 2), (1, 1, 3)]
    assert len(captured) == 1 and captured[0].replays == 3
    b = random_batch(rng, 20)  # another bucket starts its own cycle
    assert token_bucket(b.num_tokens) != 64
    runner.run(b)
    assert (runner.eager_runs, runner.captures) == (2, 1)
    assert runner.counters()["buckets_used"] == 2
    assert runner.padded_tokens == 4 * (64 - 40) + token_bucket(b.num_tokens) - b.num_tokens


def test_padded_buckets_equal_exact_eager(tiny_engine):
    """graph (padded bucket) == eager (exact shapes) for every bucket used."""
    runner = make_runner(tiny_engine, [])
    rng = np.random.default_rng(1)
    seen = set()
    for num_seqs in (1, 2, 5, 9, 17, 31, 32):
        for _ in range(3):  # eager, capture, replay
            batch = random_batch(rng, num_seqs)
            padded = runner.run(batch).clone().numpy()
            exact = tiny_engine.run_eager(batch).numpy()
            np.testing.assert_allclose(padded, exact, rtol=1e-5, atol=1e-6)
            seen.add(token_bucket(batch.num_tokens))
    assert len(seen) >= 5 and runner.replays >= 7


def test_fill_inputs_pads_with_empty_slots_and_dummy_row():
    batch = PackedBatch.from_sequences([np.array([5, 6, 7], np.int32), np.array([8], np.int32)])
    layout = InputLayout(num_tokens=8, num_seqs=4)
    host = np.full(layout.size, -7, dtype=np.int32)
    bigger = PackedBatch.from_sequences([np.array([9, 9], np.int32), np.array([4, 4, 4], np.int32),
                                         np.array([3, 3], np.int32)])
    fill_inputs(host, layout, bigger)  # NOTE: the slot's last batch leaves nothing behind in the next one's
    fill_inputs(host, layout, batch)
    sl = layout.slices()
    assert host[sl["cu_seqlens"]].tolist() == [0, 3, 4, 8, 8]  # padding is sequence 2, slot 3 is empty
    assert host[sl["input_ids"]].tolist() == [5, 6, 7, 8, 0, 0, 0, 0]
    assert host[sl["positions"]].tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
    assert host[sl["token_seq_ids"]].tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    assert host[sl["first_token_idx"]].tolist() == [0, 3, 0, 0]
    assert host[sl["last_token_idx"]].tolist() == [2, 3, 0, 0]
    np.testing.assert_allclose(host[sl["inv_seqlens"]].view(np.float32), [1 / 3, 1.0, 0, 0])
    full = InputLayout(num_tokens=4, num_seqs=2)  # an exact layout: no padding, no spare slot
    host = np.zeros(full.size, dtype=np.int32)
    fill_inputs(host, full, batch)
    assert host[full.slices()["cu_seqlens"]].tolist() == [0, 3, 4]


def test_seq_capacity():
    assert [seq_capacity(b, 256) for b in (64, 128, 192, 256, 1024, 16384)] == [65, 129, 193, 257, 257, 257]
    assert seq_capacity(64, 16) == 17


def test_over_budget_batch_is_refused(tiny_engine):
    runner = make_runner(tiny_engine, [])
    big = PackedBatch.from_sequences([np.ones(150, np.int32)] * 11)
    with pytest.raises(ValueError, match="over the largest bucket"):
        runner.run(big)


@pytest.mark.parametrize("num_tokens,num_seqs", [(1, 1), (7, 3), (64, 2), (130, 17), (16384, 257)])
def test_input_sections_start_64_byte_aligned(num_tokens, num_seqs):
    """Triton specialises on 16-byte pointer alignment: every section view must start aligned, or the
    first step compiles a kernel variant the warm-up did not."""
    layout = InputLayout(num_tokens=num_tokens, num_seqs=num_seqs)
    sections = layout.slices()
    starts = [s.start for s in sections.values()]
    assert all(start * 4 % 64 == 0 for start in starts), sections
    assert [s.stop - s.start for s in sections.values()] == [num_seqs + 1] + [num_seqs] * 3 + [num_tokens] * 3
    assert all(a.stop <= b.start for a, b in zip(sections.values(), list(sections.values())[1:]))  # no overlap
    assert layout.size == sections["token_seq_ids"].stop
