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

import os as _os

# NOTE: installed, `petal.cli`/`petal.engine`/`petal.pipeline`/`petal.bench` are sub-folders of this
# package (pyproject's package-dir). In a source checkout run without installing (the GPU hosts put
# the checkout on PYTHONPATH), they are the repository's top-level folders beside this one.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_checkout, "pyproject.toml")) and _os.path.isdir(_os.path.join(_checkout, "pipeline")):
    __path__.append(_checkout)
