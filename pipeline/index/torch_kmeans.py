"""IVF k-means on a CUDA device through torch, for hosts with the engine's GPU but ``faiss-cpu``.

FAISS's own k-means runs on the CPU unless ``faiss-gpu`` is installed; training 1-2k centroids of
1024-dim vectors then costs seconds to tens of seconds per index build, while the GPU that just
embedded the corpus sits idle. This module runs the same Lloyd iterations as FAISS's ``Clustering``
(seeded random initial centroids drawn from the sample, ``niter`` rounds of assign + mean, empty
clusters re-seeded by splitting the largest, spherical centroids for inner-product IVF) with the
assignment as a chunked matmul on the device. The centroids go into the IVF quantizer and FAISS
then trains only the codes (SQ/PQ), which it skips k-means for once the quantizer holds ``nlist``
centroids.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

ASSIGN_CHUNK_BYTES = 256 << 20  # distance tile [chunk, nlist] float32 per assignment step


def torch_cuda_available() -> bool:
    """True when torch sees a CUDA device. Imports torch only where it is loaded already (``petal
    index`` after embedding) or an NVIDIA device node exists, so CPU-only rebuilds stay light."""
    if "torch" not in sys.modules and not os.path.exists("/dev/nvidiactl"):
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def kmeans(sample: np.ndarray, nlist: int, *, niter: int, seed: int, spherical: bool, inner_product: bool,
           device: str = "cuda") -> np.ndarray:
    """``[nlist, d]`` float32 centroids of ``sample [n, d]`` float32 (``n >= nlist``).

    ``inner_product``: assign by the largest inner product (else the smallest L2 distance);
    ``spherical``: centroids are L2-normalised after each update (FAISS does this for IP IVF).
    """
    import torch

    num_points = sample.shape[0]
    if num_points < nlist:
        raise ValueError(f"k-means needs at least {nlist} points for {nlist} centroids, got {num_points}")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    points = torch.from_numpy(np.ascontiguousarray(sample, dtype=np.float32)).to(device)
    first = torch.randperm(num_points, generator=gen)[:nlist].to(device)
    centroids = points[first].clone()
    chunk = max(1, ASSIGN_CHUNK_BYTES // (4 * nlist))
    point_sq = (points * points).sum(1) if not inner_product else None
    assign = torch.empty(num_points, dtype=torch.int64, device=device)
    for _ in range(niter):
        _assign(points, centroids, assign, chunk, inner_product, point_sq)
        sums = torch.zeros_like(centroids).index_add_(0, assign, points)
        counts = torch.bincount(assign, minlength=nlist).to(points.dtype)
        empty = counts == 0
        centroids = sums / counts.clamp(min=1).unsqueeze(1)
        if bool(empty.any()):
            centroids = _split_largest(centroids, counts, empty, gen)
        if spherical:
            centroids = torch.nn.functional.normalize(centroids, dim=1)
    return centroids.float().cpu().numpy()


def _assign(points: Any, centroids: Any, out: Any, chunk: int, inner_product: bool, point_sq: Any) -> None:
    import torch

    centroid_sq = None if inner_product else (centroids * centroids).sum(1)
    for start in range(0, points.shape[0], chunk):
        block = points[start:start + chunk]
        scores = block @ centroids.T  # [chunk, nlist]
        if inner_product:
            out[start:start + chunk] = scores.argmax(1)
        else:  # argmin ||x||^2 - 2 x.c + ||c||^2; ||x||^2 is constant per row
            assert centroid_sq is not None
            out[start:start + chunk] = torch.addmm(centroid_sq.unsqueeze(0), block, centroids.T, alpha=-2).argmin(1)


def _split_largest(centroids: Any, counts: Any, empty: Any, gen: Any) -> Any:
    """Re-seed each empty centroid as a slightly perturbed copy of a populous one (as FAISS does)."""
    import torch

    eps = 1.0 / 1024
    order = torch.argsort(counts, descending=True)
    for slot, empty_index in enumerate(torch.nonzero(empty).flatten().tolist()):
        donor = int(order[slot % max(1, int((counts > 0).sum()))])
        sign = 1.0 if torch.rand(1, generator=gen).item() < 0.5 else -1.0
        centroids[empty_index] = centroids[donor] * (1 + sign * eps)
        centroids[donor] = centroids[donor] * (1 - sign * eps)
    return centroids


def train_ivf_on_torch(index: Any, sample: np.ndarray, seed: int, device: str = "cuda") -> bool:
    """Fill ``index``'s IVF quantizer with torch k-means centroids, then ``index.train(sample)`` for
    the codes. Returns False (nothing done) when ``index`` is no IVF or its quantizer is trained."""
    from petal.pipeline.index.faiss_loader import load_faiss

    faiss = load_faiss()
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None or ivf.quantizer.ntotal > 0 or len(sample) < ivf.nlist:
        return False
    centroids = kmeans(sample, ivf.nlist, niter=int(ivf.cp.niter), seed=seed, spherical=bool(ivf.cp.spherical),
                       inner_product=ivf.metric_type == faiss.METRIC_INNER_PRODUCT, device=device)
    ivf.quantizer.add(centroids)
    index.train(sample)  # NOTE: FAISS skips k-means when the quantizer holds nlist centroids; codes only
    return True
