"""Torch k-means (the GPU training path for faiss-cpu hosts) against FAISS's own, on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.torch_kmeans import kmeans, train_ivf_on_torch


def clustered(num: int, dim: int, centers: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    middles = rng.normal(size=(centers, dim)).astype(np.float32)
    x = middles[rng.integers(0, centers, num)] + 0.3 * rng.normal(size=(num, dim)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def objective(x: np.ndarray, centroids: np.ndarray) -> float:
    """Mean squared distance of each point to its nearest centroid."""
    d = (x * x).sum(1)[:, None] - 2 * x @ centroids.T + (centroids * centroids).sum(1)[None, :]
    return float(d.min(1).mean())


@pytest.mark.parametrize("inner_product", [True, False])
def test_torch_kmeans_matches_faiss_quality(inner_product: bool) -> None:
    faiss = load_faiss()
    x = clustered(4000, 32, 40)
    ours = kmeans(x, 40, niter=20, seed=1, spherical=inner_product, inner_product=inner_product, device="cpu")
    assert ours.shape == (40, 32) and np.isfinite(ours).all()
    ref = faiss.Kmeans(32, 40, niter=20, seed=1, spherical=inner_product)
    ref.train(x)
    # same algorithm, other random draws: the objective is within a few percent of FAISS's
    assert objective(x, ours) <= objective(x, ref.centroids) * 1.05
    if inner_product:
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)


def test_empty_clusters_are_reseeded() -> None:
    x = np.repeat(clustered(50, 16, 5), 20, axis=0)  # many duplicate points: empty clusters appear
    centroids = kmeans(x, 60, niter=10, seed=0, spherical=False, inner_product=False, device="cpu")
    assert np.isfinite(centroids).all()
    assert len(np.unique(centroids.round(5), axis=0)) == 60


# NOTE: PQ8x4, not PQ8: FAISS trains an IVF32,PQ8 on these 6000 points in ~20 s on the 2-core CPU (PQ8x4: ~1 s);
# the coarse quantizer, which torch trains, is the same
@pytest.mark.parametrize("factory", ["IVF32,Flat", "IVF32,SQ8", "IVF32,PQ8x4"])
def test_ivf_trained_on_torch_searches_like_faiss(factory: str) -> None:
    faiss = load_faiss()
    x = clustered(6000, 64, 50, seed=3)
    queries = clustered(200, 64, 50, seed=4)
    exact = faiss.IndexFlatIP(64)
    exact.add(x)
    _, truth = exact.search(queries, 10)
    recalls = {}
    for how in ("torch", "faiss"):
        index = faiss.index_factory(64, factory, faiss.METRIC_INNER_PRODUCT)
        if how == "torch":
            assert train_ivf_on_torch(index, x, seed=1, device="cpu")
        else:
            index.train(x)
        assert index.is_trained
        index.add(x)
        faiss.extract_index_ivf(index).nprobe = 4
        _, found = index.search(queries, 10)
        recalls[how] = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth)])
    assert recalls["torch"] >= recalls["faiss"] - 0.05, recalls


def test_not_for_trained_or_flat_indexes() -> None:
    faiss = load_faiss()
    x = clustered(500, 16, 4)
    assert not train_ivf_on_torch(faiss.IndexFlatIP(16), x, seed=0, device="cpu")
    index = faiss.index_factory(16, "IVF8,Flat", faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    assert not train_ivf_on_torch(index, x, seed=0, device="cpu")


@pytest.mark.gpu
def test_index_training_uses_the_cuda_device_with_faiss_cpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from petal.pipeline.index.gpu import num_gpus, train

    faiss = load_faiss()
    if num_gpus() > 0:
        pytest.skip("faiss-gpu trains on the GPU itself")
    x = clustered(20000, 128, 100, seed=5)
    index = faiss.index_factory(128, "IVF256,SQ8", faiss.METRIC_INNER_PRODUCT)
    assert train(index, x, 0, seed=1) == "torch:cuda"
    assert index.is_trained and faiss.extract_index_ivf(index).quantizer.ntotal == 256
