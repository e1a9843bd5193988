"""A corpus with enough vectors to train its index is trained, however many of them the tuner holds out. The tuner
takes 1,000 vectors as its queries first, and training took only the rest: 1,227 vectors under ``IVF16,PQ8`` or
``PQ8`` left 227 for 256 PQ centroids, and FAISS refused to train (78 'Number of training points (227) should be
at least as large as number of clusters (256)'), nothing published. Training now takes queries too when the rest
is short; with enough vectors the two samples stay disjoint."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import petal
from petal.cli.main import cli
from petal.pipeline.index.source import split_sample
from tests._open_audit_shared import vectors_shard


@pytest.mark.parametrize("factory", ["IVF16,PQ8", "PQ8", "OPQ8,PQ8"])
def test_an_index_whose_rest_after_the_queries_is_too_few_to_train_is_built(tmp_path, factory):
    vectors = vectors_shard(tmp_path / "v.parquet", rows=1227, dim=32, seed=3)
    result = CliRunner().invoke(cli, ["index", str(tmp_path / "v.parquet"), "--vectors-column", "emb", "--out",
                                      str(tmp_path / "out"), "-q", "--index-factory", factory])
    assert result.exit_code == 0, result.output
    with petal.open_index(tmp_path / "out") as index:
        hits = index.search_stored(vectors[:5], k=3)
    assert [len(row) for row in hits] == [3] * 5


@pytest.mark.parametrize(("total", "queries", "train"), [(1227, 1000, 65536), (1227, 1000, 500), (300, 1000, 256),
                                                          (50_000, 1000, 4096)])
def test_training_takes_queries_only_when_the_rest_is_short(total, queries, train):
    held, training = split_sample(total, queries, train, seed=7)
    assert len(held) == min(queries, total)
    assert len(training) == min(train, total)
    assert len(np.unique(training)) == len(training) and training.max() < total
    overlap = len(np.intersect1d(held, training))
    assert overlap == max(0, min(train, total) - (total - len(held)))  # only as many as the rest lacks
