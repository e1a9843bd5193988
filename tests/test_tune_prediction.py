"""The tuner's predicted recall curve (exact-code IVF): equal to what searching each setting measures (ties of the
k-th true distance counted as found, as the measure counts them), and only a starting point: the chosen setting is
always measured, and where there are more ties than the truth lists every setting is."""

from __future__ import annotations

import numpy as np
import pytest

from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.tune import (
    TRUTH_EXTRA,
    TUNE_K,
    RecallAtK,
    exact_codes_ivf,
    predicted_recalls,
    search_grid,
    tune,
)
from tests.index_data import clustered_vectors, random_vectors


def ivf_flat(vectors: np.ndarray, nlist: int, metric: str = "ip"):
    faiss = load_faiss()
    kind = faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2
    index = faiss.index_factory(vectors.shape[1], f"IVF{nlist},Flat", kind)
    index.train(vectors)
    index.add_with_ids(vectors, np.arange(len(vectors), dtype=np.int64))
    return index


def truth_of(vectors: np.ndarray, query_ids: np.ndarray, metric: str) -> RecallAtK:
    """As petal index measures: the exact neighbours past k + 1 (``TRUTH_EXTRA``), ties of the k-th counted."""
    faiss = load_faiss()
    flat = faiss.IndexFlatIP(vectors.shape[1]) if metric == "ip" else faiss.IndexFlatL2(vectors.shape[1])
    flat.add(vectors)
    truth = flat.search(vectors[query_ids], TUNE_K + 1 + TRUTH_EXTRA)[1]
    return RecallAtK(vectors[query_ids], query_ids, truth, 10, lambda ids: vectors[ids], metric)


def measured(index, queries, truth: RecallAtK, nprobe: int) -> np.ndarray:
    index.nprobe = nprobe
    return truth(index.search(queries, 11)[1])


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_the_predicted_curve_is_what_search_measures(metric):
    vectors = clustered_vectors(6000, 32, seed=21, spread=1.5)
    index = ivf_flat(vectors, 64, metric)
    query_ids = np.random.default_rng(0).choice(len(vectors), 300, replace=False)
    queries, truth = vectors[query_ids], truth_of(vectors, query_ids, metric)
    nprobes = [p["nprobe"] for p in search_grid(index)]
    predicted = predicted_recalls(exact_codes_ivf(index), truth, nprobes)
    for nprobe, recalls in zip(nprobes, predicted):
        assert np.array_equal(recalls, measured(index, queries, truth, nprobe)), nprobe
    assert predicted[0].mean() < 0.9 and predicted[-1].mean() == 1.0  # a real curve, not a flat one


def test_tune_picks_the_cheapest_measured_setting_and_measures_it():
    vectors = random_vectors(6000, 32, seed=22)
    index = ivf_flat(vectors, 64)
    query_ids = np.random.default_rng(1).choice(len(vectors), 300, replace=False)
    queries, truth = vectors[query_ids], truth_of(vectors, query_ids, "ip")
    tuning = tune(index, queries, truth, 0.9)
    chosen = tuning.params["nprobe"]
    assert tuning.reached and tuning.recall_at_10_low >= 0.9
    assert tuning.curve[-1]["params"] == {"nprobe": chosen} and tuning.curve[-1]["ms_per_query"] is not None
    assert all(step.get("predicted") for step in tuning.curve[:-1])  # cheaper settings were not searched
    cheaper = [p["nprobe"] for p in search_grid(index) if p["nprobe"] < chosen]
    for nprobe in cheaper:  # every cheaper setting really falls short
        recalls = measured(index, queries, truth, nprobe)
        assert recalls.mean() - 2 * recalls.std(ddof=1) / np.sqrt(len(recalls)) < 0.9


def test_ties_count_as_found_and_the_cheapest_setting_that_reaches_is_chosen():
    """Binary vectors: many neighbours tie on distance across lists, and the search breaks ties its own way. Any
    vector at the k-th true distance is a true neighbour (exact search listed the lowest ids: the tuner scored the
    others misses and stopped short of 0.9 at every nprobe). More ties than the truth lists: the prediction would
    undercount, so every setting is measured, and the one chosen is the cheapest whose measured recall reaches."""
    vectors = np.random.default_rng(0).integers(0, 2, (4000, 12)).astype(np.float32)
    index = ivf_flat(vectors, 32, "l2")
    query_ids = np.random.default_rng(2).choice(len(vectors), 200, replace=False)
    queries, truth = vectors[query_ids], truth_of(vectors, query_ids, "l2")
    assert truth.ties_past_truth
    tuning = tune(index, queries, truth, 0.9)
    assert not any(step.get("predicted") for step in tuning.curve)
    lows = {}
    for params in search_grid(index):
        recalls = measured(index, queries, truth, params["nprobe"])
        lows[params["nprobe"]] = recalls.mean() - 2 * recalls.std(ddof=1) / np.sqrt(len(recalls))
    assert tuning.reached and tuning.recall_at_10_low >= 0.9
    assert tuning.params["nprobe"] == min(n for n, low in lows.items() if low >= 0.9)
    assert tuning.recall_at_10 == round(float(measured(index, queries, truth, tuning.params["nprobe"]).mean()), 4)
