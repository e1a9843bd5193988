"""[3] Packing: pure, first come first served, bounded by tokens and sequences."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petal.engine.batch import PackedBatch, token_bucket, token_buckets
from petal.pipeline.ingest.pack import PackConfig, Packer, pack, padded_tokens, plan_batches

lengths_st = st.lists(st.integers(min_value=1, max_value=300), min_size=0, max_size=200)


@settings(max_examples=200, deadline=None)
@given(lengths=lengths_st, budget=st.integers(300, 2000), max_seqs=st.integers(1, 64))
def test_plan_respects_budget_and_covers_every_sequence_once_in_order(lengths, budget, max_seqs):
    config = PackConfig(budget, max_seqs)
    batches = plan_batches(lengths, config)
    flat = [i for b in batches for i in b]
    assert flat == list(range(len(lengths)))  # every sequence exactly once, order recoverable
    for b in batches:
        assert len(b) >= 1
        assert sum(lengths[i] for i in b) <= budget
        assert len(b) <= max_seqs
    # first come first served: a batch closes only when the next sequence does not fit
    for b, nxt in itertools.pairwise(batches):
        total = sum(lengths[i] for i in b)
        assert total + lengths[nxt[0]] > budget or len(b) == max_seqs


@settings(max_examples=100, deadline=None)
@given(lengths=lengths_st, budget=st.integers(300, 2000), max_seqs=st.integers(1, 64))
def test_packer_matches_plan_and_builds_valid_batches(lengths, budget, max_seqs):
    rng = np.random.default_rng(len(lengths))
    seqs = [rng.integers(0, 30000, n).astype(np.int32) for n in lengths]
    config = PackConfig(budget, max_seqs)
    batches = list(pack(enumerate(seqs), config))
    assert [list(b.keys) for b in batches] == [list(r) for r in plan_batches(lengths, config)]
    for batch in batches:
        cu = batch.cu_seqlens
        assert cu.dtype == np.int32 and cu[0] == 0 and np.all(np.diff(cu) > 0)  # monotone, no empty sequences
        assert cu[-1] == batch.num_tokens == len(batch.positions)
        assert batch.num_tokens <= budget and batch.num_seqs <= max_seqs
        assert batch.max_seqlen == int(np.diff(cu).max())
        for j, key in enumerate(batch.keys):  # tokens and positions recoverable per sequence
            start, end = cu[j], cu[j + 1]
            np.testing.assert_array_equal(batch.input_ids[start:end], seqs[key])
            np.testing.assert_array_equal(batch.positions[start:end], np.arange(end - start))
        assert 0 <= padded_tokens(batch) < (64 if batch.num_tokens <= 1024 else 256)


def test_sequence_over_budget_is_an_error():
    with pytest.raises(ValueError, match="over the token budget 10"):
        plan_batches([5, 11], PackConfig(10, 4))
    with pytest.raises(ValueError, match="over the token budget"):
        Packer(PackConfig(10, 4)).add("k", np.ones(11, dtype=np.int32))


def test_packer_flush_and_empty():
    packer = Packer(PackConfig(100, 2))
    assert packer.flush() is None
    assert packer.add("a", np.ones(3, np.int32)) is None
    assert packer.add("b", np.ones(3, np.int32)) is None
    full = packer.add("c", np.ones(3, np.int32))  # max_seqs reached
    assert full is not None and list(full.keys) == ["a", "b"]
    rest = packer.flush()
    assert rest is not None and list(rest.keys) == ["c"]
    with pytest.raises(ValueError, match="empty"):
        packer.add("d", np.zeros(0, np.int32))


@pytest.mark.parametrize(("tokens", "bucket"), [(0, 16), (1, 16), (16, 16), (17, 32), (32, 32), (33, 64), (64, 64),
                                                (65, 128), (1024, 1024), (1025, 1280), (1280, 1280), (1281, 1536),
                                                (16384, 16384)])
def test_token_bucket(tokens, bucket):
    assert token_bucket(tokens) == bucket


def test_token_buckets_cover_budget():
    buckets = token_buckets(16384)
    assert buckets[:5] == [16, 32, 64, 128, 192] and buckets[17] == 1024 and buckets[18] == 1280
    assert buckets[-1] == 16384 and buckets == sorted(set(buckets))
    assert all(token_bucket(b) == b for b in buckets)
    assert token_buckets(100) == [16, 32, 64, 128]
    assert token_buckets(1100) == [16, 32, *range(64, 1025, 64), 1280]
    assert token_buckets(10) == [16] and token_buckets(20) == [16, 32] and token_buckets(40) == [16, 32, 64]


def test_from_sequences_rejects_empty():
    with pytest.raises(ValueError):
        PackedBatch.from_sequences([])
    with pytest.raises(ValueError, match="empty"):
        PackedBatch.from_sequences([np.ones(2, np.int32), np.zeros(0, np.int32)])
