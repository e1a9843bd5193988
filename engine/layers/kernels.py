"""Optional fused CUDA kernels (FlashInfer's norm and activation ops), used where they pay.

``PETAL_FUSED_KERNELS=0`` turns them off (benchmarks compare both); on the CPU they never run.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType

import torch


@functools.cache
def _flashinfer() -> ModuleType | None:
    if os.environ.get("PETAL_FUSED_KERNELS", "1") == "0":
        return None
    try:
        import flashinfer
    except Exception:  # not installed, or no CUDA build: the torch ops serve
        return None
    module: ModuleType = flashinfer
    return module


def fused(x: torch.Tensor) -> ModuleType | None:
    """FlashInfer, if it should run on ``x`` (a CUDA fp16/bf16 tensor), else ``None``."""
    if not x.is_cuda or x.dtype not in (torch.bfloat16, torch.float16):
        return None
    return _flashinfer()
