"""Importing FAISS once, with a BLAS kernel that matches the CPU.

The ``faiss-cpu`` wheels bundle OpenBLAS 0.3.15, which does not know CPUs newer than Ice Lake:
on a Sapphire Rapids Xeon it falls back to its generic "Prescott" SSE3 kernels and runs sgemm
(k-means, exact search, IVF assignment) about 6x slower than it could (measured on the 2-core
development machine: 14 vs 88 GFLOP/s). Any CPU with the AVX-512 foundation set runs the
SkylakeX kernels, so petal selects them for FAISS's OpenBLAS, unless the user chose a core type.
"""

from __future__ import annotations

import functools
import os
import threading
from types import ModuleType

SKYLAKEX_FLAGS = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


_LOADING = threading.Lock()


@functools.cache
def load_faiss() -> ModuleType:
    """``import faiss`` (heavy: call it inside the functions that need it).

    NOTE: one thread at a time (``functools.cache`` does not hold back a second first call): two threads opening
    indexes at once both set and both removed the variable below, and the second removal was a KeyError."""
    with _LOADING:
        return _import_faiss()


def _import_faiss() -> ModuleType:
    chosen = "OPENBLAS_CORETYPE" not in os.environ and _cpu_flags() >= SKYLAKEX_FLAGS
    if chosen:
        # NOTE: OpenBLAS reads the variable once, when the library loads; it is removed again right
        # after, so numpy's own (newer) OpenBLAS and child processes keep their own choice.
        os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"
    try:
        import faiss
    finally:
        if chosen:
            del os.environ["OPENBLAS_CORETYPE"]
    return faiss
