"""petal: Parquet shards -> a searchable FAISS index, and queries against it.

The Python API (the CLI is written on it)::

    import petal

    report = petal.index(["shards/"], "idx")                 # -> petal.RunReport
    hits = petal.open_index("idx").search(["a query"], k=5)  # -> list[list[petal.Hit]]
    vectors = petal.Embedder().encode(["a text"])            # -> np.ndarray [num_texts, dim] float32
    petal.verify("idx")                                       # -> petal.VerifyReport (every byte checked)
    petal.versions("idx")                                     # -> list[petal.VersionEntry], newest first
    petal.rollback("idx")                                     # -> petal.Rollback (the previous version made live)

Failures raise ``petal.PetalError`` subclasses, each with the ``exit_code`` of the CLI's contract.
Heavy modules (torch, FAISS, pyarrow) load on first use, so ``import petal`` is instant.
"""

from __future__ import annotations

import sys as _sys

if _sys.argv and _sys.argv[0].rpartition("/")[2] == "petal":  # the `petal` script: a quiet stop signal from here on
    from petal._startup import quiet_signals as _quiet_signals

    _quiet_signals()
if "multiprocessing.spawn" in _sys.modules:  # maybe a petal worker still starting: its stop signals end it from here on
    from petal._startup import take_in_starting_worker as _take_in_starting_worker

    _take_in_starting_worker()

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

import os as _os

# NOTE: installed, `petal.cli`/`petal.engine`/`petal.pipeline`/`petal.bench` are sub-folders of this
# package (pyproject's package-dir). In a source checkout run without installing (the GPU hosts put
# the checkout on PYTHONPATH), they are the repository's top-level folders beside this one.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_checkout, "pyproject.toml")) and _os.path.isdir(_os.path.join(_checkout, "pipeline")):
    __path__.append(_checkout)

_ERRORS = "petal.pipeline.reliability.errors"
# public name -> the module that defines it (imported on first access: PEP 562)
_EXPORTS = {
    "index": "petal.pipeline.api",
    "rebuild": "petal.pipeline.api",
    "open_index": "petal.pipeline.api",
    "verify": "petal.pipeline.api",
    "versions": "petal.pipeline.api",
    "rollback": "petal.pipeline.api",
    "VersionEntry": "petal.pipeline.jobs.versions",
    "Rollback": "petal.pipeline.jobs.versions",
    "VerifyReport": "petal.pipeline.index.verify",
    "Embedder": "petal.pipeline.jobs.embed",
    "Index": "petal.pipeline.jobs.searcher",
    "Hit": "petal.pipeline.index.search",
    "RunReport": "petal.pipeline.jobs.report",
    **{name: _ERRORS for name in ("PetalError", "UsageError", "BadInputError", "NoInputError", "OutputError",
                                  "PetalIOError", "TemporaryFailure", "ConfigError", "Interrupted")},
}
__all__ = [
    "BadInputError", "ConfigError", "Embedder", "Hit", "Index", "Interrupted", "NoInputError", "OutputError",
    "PetalError", "PetalIOError", "Rollback", "RunReport", "TemporaryFailure", "UsageError", "VerifyReport",
    "VersionEntry", "__version__", "index", "open_index", "rebuild", "rollback", "verify", "versions",
]

if TYPE_CHECKING:
    from petal.pipeline.api import index, open_index, rebuild, rollback, verify, versions
    from petal.pipeline.index.search import Hit
    from petal.pipeline.index.verify import VerifyReport
    from petal.pipeline.jobs.embed import Embedder
    from petal.pipeline.jobs.report import RunReport
    from petal.pipeline.jobs.searcher import Index
    from petal.pipeline.jobs.versions import Rollback, VersionEntry
    from petal.pipeline.reliability.errors import (
        BadInputError,
        ConfigError,
        Interrupted,
        NoInputError,
        OutputError,
        PetalError,
        PetalIOError,
        TemporaryFailure,
        UsageError,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'petal' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
