"""FAISS on the GPU when ``faiss-gpu`` is installed (extra ``gpu``) and sees a device; else the CPU.

Only the build uses the GPU: k-means training (a GPU flat index assigns points to centroids,
the result lands in the CPU index) and adding to IVF indexes (a GPU copy of the trained, empty
index encodes one part of the vectors, then moves back to the CPU). Published indexes are CPU
indexes, so ``petal query`` never needs a GPU. With ``faiss-cpu`` on a CUDA host, IVF k-means runs
through torch on the device instead (``pipeline/index/torch_kmeans.py``).
"""

from __future__ import annotations

from typing import Any

from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.torch_kmeans import torch_cuda_available, train_ivf_on_torch


def num_gpus() -> int:
    """GPUs FAISS can use (0 with ``faiss-cpu``)."""
    faiss = load_faiss()

    get = getattr(faiss, "get_num_gpus", None)
    return int(get()) if get is not None else 0


def train(index: Any, sample: Any, ngpu: int, seed: int = 1234) -> str:
    """``index.train(sample)`` (``[n, d]`` float32, or packed bits for a binary index); k-means on the
    GPUs when ``ngpu > 0``, else (float IVF) through torch on a CUDA device when one is there
    (``pipeline/index/torch_kmeans.py``). Returns where."""
    faiss = load_faiss()

    if isinstance(index, faiss.IndexBinary):  # k-means over the bits as floats (L2), FAISS's binary rule
        ivf = index if isinstance(index, faiss.IndexBinaryIVF) else None
        flat = (lambda: faiss.IndexFlatL2(index.d))
    else:
        ivf = faiss.try_extract_index_ivf(index)
        flat = (lambda: faiss.IndexFlat(ivf.d, ivf.metric_type))
        # faiss-cpu beside the engine's GPU: k-means through torch on the device, codes by FAISS
        if ngpu <= 0 and ivf is not None and torch_cuda_available() and train_ivf_on_torch(index, sample, seed):
            return "torch:cuda"
    if ngpu <= 0 or ivf is None:
        index.train(sample)
        return "cpu"
    clustering = faiss.index_cpu_to_all_gpus(flat(), ngpu=ngpu)
    # NOTE: FAISS holds a raw pointer; ``clustering`` must outlive train() and be detached after.
    ivf.clustering_index = clustering
    try:
        index.train(sample)
    finally:
        ivf.clustering_index = None
    return f"gpu:{ngpu}"


def to_gpu(index: Any) -> Any | None:
    """A GPU copy of an (empty, trained) IVF index to add vectors with, or ``None`` where FAISS
    cannot place this index type on the GPU (the caller then adds on the CPU)."""
    faiss = load_faiss()

    if faiss.try_extract_index_ivf(index) is None:
        return None
    options = faiss.GpuMultipleClonerOptions()
    options.useFloat16 = False
    options.indicesOptions = faiss.INDICES_64_BIT
    if hasattr(options, "allowCpuCoarseQuantizer"):
        options.allowCpuCoarseQuantizer = True  # an HNSW coarse quantizer stays on the CPU
    try:
        return faiss.index_cpu_to_all_gpus(index, co=options, ngpu=1)
    except (RuntimeError, AttributeError):
        return None


def to_cpu(index: Any) -> Any:
    faiss = load_faiss()

    return faiss.index_gpu_to_cpu(index)
