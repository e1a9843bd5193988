"""petal: Parquet shards -> a searchable FAISS index, and queries against it.

The Python API (the CLI is written on it)::

    import petal

    report = petal.index(["shards/"], "idx")            # -> RunReport
    hits = petal.open_index("idx").search(["a query"], k=5)  # -> list[list[Hit]]
    vectors = petal.Embedder().encode(["a text"])         # -> np.ndarray [num_texts, dim] float32

Heavy modules (torch, FAISS, pyarrow) load on first use, so ``import petal`` is instant.
"""

from __future__ import annotations

__version__ = "0.1.0"
