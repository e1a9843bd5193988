"""Bounds on the search parameters a caller may ask for: ``petal query``'s flags and ``petal serve``'s request
fields (no heavy imports: the CLI reads them to build its options)."""

from __future__ import annotations

MAX_K = 1 << 20  # hits per query: far above any index's useful k, far below what overflows FAISS's int
MAX_NPROBE = (1 << 31) - 1  # FAISS takes nprobe as a C int
MAX_RESCORE = 1 << 16  # binary indexes: rescore x k float candidates
