"""``petal.open_index``: a published index opened for search by text or by the model's vectors.

The index opens at once; the model (``QueryService``, ``jobs/query.py``) loads on the first search
by text, so searching by vectors needs no model at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from petal.pipeline.index.search import Hit, IndexReader
from petal.pipeline.jobs.settings import petal_error
from petal.pipeline.manifest import Manifest
from petal.pipeline.reliability.errors import UsageError

if TYPE_CHECKING:
    # NOTE: imported where the model is first needed: searching by vectors never loads torch or tokenizers
    from petal.pipeline.jobs.query import QueryService


class Index:
    """A published index (an output directory, following CURRENT, or a version directory)."""

    def __init__(self, path: Path, *, model: str | None = None, device: str = "auto", dtype: str = "auto",
                 attention: str = "auto", nprobe: int | None = None, rescore: int | None = None,
                 query_prompt: str | None = None, allow_pickle_weights: bool = False) -> None:
        if nprobe is not None and nprobe < 1:
            raise UsageError(f"nprobe {nprobe} < 1")
        if rescore is not None and rescore < 0:
            raise UsageError(f"rescore {rescore} < 0")
        self.reader = IndexReader(Path(path), nprobe=nprobe, rescore=rescore)
        self._model_settings: dict[str, Any] = {"model": model, "device": device, "dtype": dtype,
                                                "attention": attention, "query_prompt": query_prompt,
                                                "allow_pickle_weights": allow_pickle_weights}
        self._service: QueryService | None = None

    @property
    def path(self) -> Path:
        """The version directory searched."""
        return self.reader.dir

    @property
    def manifest(self) -> Manifest:
        """The version's manifest, typed (``pipeline/manifest.py``)."""
        return self.reader.manifest

    @property
    def info(self) -> dict[str, Any]:
        """The version's manifest as ``petal info --json`` prints it: model, dim, metric, index, counts, shards."""
        return self.reader.manifest.to_dict()

    @property
    def dim(self) -> int:
        return self.reader.dim

    @property
    def num_vectors(self) -> int:
        return self.reader.ntotal

    @property
    def notes(self) -> list[str]:
        """Settings given that do nothing for this index (``nprobe`` without IVF, ``rescore`` without binary codes)."""
        return list(self.reader.ignored)

    def check_where(self, where: str) -> None:
        """A ``where`` filter this index can apply (``UsageError`` naming a bad expression or unknown column)."""
        try:
            self.reader.selector(where)
        except ValueError as exc:
            raise petal_error(exc) from exc

    def query_model(self) -> QueryService:
        """The index's model, loaded once (gone or different weights: ``ConfigError``, exit 78; an index of
        precomputed vectors has none: ``UsageError``)."""
        if self.manifest.precomputed:
            raise UsageError(f"{self.path} was built from precomputed vectors (--vectors-column): query it by "
                             "vectors (petal query --vector-file Q.npy, Index.search_stored)")
        if self._service is None:
            from petal.pipeline.jobs.query import QueryService

            try:
                self._service = QueryService(self.path, reader=self.reader, **self._model_settings)
            except ValueError as exc:  # --device cuda without CUDA, an unknown dtype, a model's own error
                raise petal_error(exc) from exc
        return self._service

    def search(self, queries: str | Iterable[str] | np.ndarray, k: int = 10,
               where: str | None = None) -> list[list[Hit]]:
        """The top ``k`` hits of each query, best first (fewer when the index holds fewer vectors, or fewer
        documents match ``where``); each hit carries the kept columns (``--keep-columns``) as ``Hit.fields``.

        ``queries``: texts (embedded as queries with the index's model, prompt and output settings), or
        the model's float vectors ``[num_queries, model dim]`` (``Embedder(model).encode(texts, query=True)``),
        which get the index's output transform (``--dim``, normalisation, quantization).
        ``where``: only documents matching it, on kept columns (``"lang = 'en' AND year IN (2020, 2021)"``),
        applied inside the FAISS search.
        """
        if k < 1:
            raise UsageError(f"k {k} < 1")
        if where is not None:
            self.check_where(where)
        if isinstance(queries, np.ndarray):
            return self._searched(lambda: self.reader.search(self._stored(queries), k, where=where))
        texts = [queries] if isinstance(queries, str) else list(queries)
        if not texts:
            return []
        service = self.query_model()
        return self._searched(lambda: service.search(texts, k, where=where))

    def search_stored(self, vectors: np.ndarray, k: int = 10, where: str | None = None) -> list[list[Hit]]:
        """Search by vectors as the index stores them (``[num_queries, dim]`` or ``[dim]``, after ``--dim`` and
        normalisation; an index built with ``--vectors-column``: vectors like that column's). No model."""
        if k < 1:
            raise UsageError(f"k {k} < 1")
        rows = vectors[None, :] if vectors.ndim == 1 else vectors
        if rows.ndim != 2 or rows.shape[1] != self.reader.dim or rows.dtype.kind != "f":
            raise UsageError(f"query vectors of shape {vectors.shape} and type {vectors.dtype}: this index holds "
                             f"[num_queries, {self.reader.dim}] float vectors")
        if where is not None:
            self.check_where(where)
        return self._searched(lambda: self.reader.search(np.asarray(rows, dtype=np.float32), k, where=where))

    @staticmethod
    def _searched(work: Any) -> list[list[Hit]]:
        try:
            result: list[list[Hit]] = work()
        except ValueError as exc:
            raise petal_error(exc) from exc
        return result

    def texts(self, hits: list[Hit]) -> list[str | None]:
        """Each hit's text, read back from its shard (``None`` when the shard or row is gone)."""
        return self.reader.texts(hits, self.manifest.columns.text_column)

    def _stored(self, vectors: np.ndarray) -> np.ndarray:
        rows = vectors[None, :] if vectors.ndim == 1 else vectors
        transform = self.manifest.output
        width = transform.model_dim if transform is not None else self.reader.dim
        if rows.ndim != 2 or rows.shape[1] != width or rows.dtype.kind != "f":
            raise UsageError(f"query vectors of shape {vectors.shape} and type {vectors.dtype}: this index takes "
                             f"the model's float vectors, [num_queries, {width}]")
        return transform.stored(rows) if transform is not None else np.asarray(rows, dtype=np.float32)
