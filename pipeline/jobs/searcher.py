"""``petal.open_index``: a published index opened for search by text or by the model's vectors.

The index opens at once; the model (``QueryService``, ``jobs/query.py``) loads on the first search
by text, so searching by vectors needs no model at all.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsIndex

import numpy as np

from petal.engine.config import device_problem
from petal.pipeline.index.bounds import MAX_NPROBE
from petal.pipeline.index.filters import FilterError
from petal.pipeline.index.search import Hit, IndexReader, OversizedVector, current_pointer
from petal.pipeline.ingest.text_rule import skip_reason, valid_text
from petal.pipeline.jobs.settings import (
    Texts,
    check_model_settings,
    is_tensor,
    kind_of,
    out_path,
    petal_error,
    text_items,
    whole_number,
)
from petal.pipeline.manifest import Manifest
from petal.pipeline.reliability.errors import ArgumentTypeError, UsageError, arguments_named, keyword_names
from petal.pipeline.store.outputs import squared_norm_overflows

if TYPE_CHECKING:
    # NOTE: imported where the model is first needed: searching by vectors never loads torch or tokenizers
    from petal.pipeline.jobs.query import QueryService


class Index:
    """A published index (an output directory, following CURRENT, or a version directory)."""

    @keyword_names()
    @arguments_named("petal.Index()")
    def __init__(self, path: str | os.PathLike[str], *, model: str | None = None, device: str = "auto",
                 dtype: str = "auto", attention: str = "auto", nprobe: int | None = None, rescore: int | None = None,
                 query_prompt: str | None = None, allow_pickle_weights: bool = False,
                 _caller: str = "petal.Index()") -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise ArgumentTypeError(f"path {path!r} is {kind_of(path)}, not a path to an index")
        # NOTE: a file:// URL is the local path it names, another URL a UsageError, as petal query's INDEX (it was
        # taken for a relative path: open_index("file:///idx") looked for /cwd/file:/idx)
        given = out_path(path, "path")
        root = given.absolute()
        # NOTE: judged here, not only in open_index: petal.Index(...) is public and constructed directly too
        model = check_model_settings({"model": model, "device": device, "dtype": dtype, "attention": attention,
                                      "query_prompt": query_prompt, "allow_pickle_weights": allow_pickle_weights},
                                     _caller)  # NOTE: file:///m is the directory /m, as petal query --model's
        # NOTE: device="cpu" with a dtype or attention only CUDA runs: refused here, as petal.Embedder and the CLI do
        # (was found at the first search by text, after torch and the model loaded)
        problem = device_problem(device, dtype, attention) if isinstance(device, str) else None
        if problem is not None:
            raise UsageError(problem.replace("--dtype ", "dtype ").replace("--attention ", "attention "))
        nprobe = None if nprobe is None else whole_number(nprobe, "nprobe", 1)
        if nprobe is not None and nprobe > MAX_NPROBE:  # NOTE: FAISS raised at the first search (a C int)
            raise UsageError(f"--nprobe {nprobe} > {MAX_NPROBE}: FAISS takes it as a C int")
        rescore = None if rescore is None else whole_number(rescore, "rescore", 0)
        # NOTE: root is absolute: a caller's later chdir must not move the index (reopened() read CURRENT, and path
        # named the version, relative to whatever the working directory had become)
        self._reader: IndexReader | None = IndexReader(root, nprobe=nprobe, rescore=rescore)
        self._root, self._nprobe, self._rescore = root, nprobe, rescore
        self._given = given  # the path as the caller gave it: ``info["path"]`` is under it, as petal info --json's
        self._refused: str | None = None  # the version CURRENT named that ``reopened`` could not open
        self._model_settings: dict[str, Any] = {"model": model, "device": device, "dtype": dtype,
                                                "attention": attention, "query_prompt": query_prompt,
                                                "allow_pickle_weights": allow_pickle_weights}
        self._service: QueryService | None = None
        self._service_lock = threading.Lock()  # NOTE: threads searching at once load the model once

    @property
    def reader(self) -> IndexReader:
        """The open version (``UsageError`` after ``close()``)."""
        if self._reader is None:
            raise UsageError(f"this index ({self._root}) was closed: open it again (petal.open_index)")
        return self._reader

    def close(self) -> None:
        """Let the version go: its lease (a ``petal index`` run may prune it again) and, once nothing else holds
        them, its files and memory. Searching afterwards raises ``UsageError``; closing again does nothing. Also
        the end of a ``with petal.open_index(...) as index:`` block.

        NOTE: explicit, not left to the garbage collector: an ``Index`` caught in a reference cycle lives until a
        full collection, and ``petal query`` freezes what exists at start-up (``startup_done``), cycles included."""
        reader, self._reader = self._reader, None
        self._service = None
        if reader is not None:
            reader.close()

    def __repr__(self) -> str:
        reader = self._reader
        if reader is None:
            return f"<petal.Index {str(self._root)!r} (closed)>"
        manifest = reader.manifest
        return (f"<petal.Index {str(self._root)!r} version={reader.dir.name!r} vectors={reader.ntotal} "
                f"dim={reader.dim} metric={manifest.metric!r} index={manifest.index.factory!r} "
                f"model={manifest.model.display!r}>")

    def __enter__(self) -> Index:
        self.reader  # noqa: B018  (a closed index: UsageError, as every other use)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        """The version's manifest as ``petal info --json`` prints it: ``path`` (the version directory, under the path
        as given, as the command and ``petal.verify``'s ``version_dir`` name it; ``Index.path`` is it absolute), model,
        dim, metric, index, counts, shards."""
        reader = self.reader
        # NOTE: was the absolute path: petal info idx --json said "idx/versions/v...", Index.info "/home/.../idx/..."
        try:
            shown = str(self._given / reader.dir.relative_to(self._root))
        except ValueError:
            shown = str(reader.dir)
        return {"path": shown, **reader.manifest.to_dict()}

    @property
    def dim(self) -> int:
        """Dimensions of the stored vectors (after ``--dim``), the width ``search_stored`` takes; binary indexes
        count bits."""
        return self.reader.dim

    @property
    def num_vectors(self) -> int:
        """Vectors (documents) the version holds: the most hits a query can get."""
        return self.reader.ntotal

    @property
    def num_truncated(self) -> int:
        """Query texts cut at the model's limit by this index's searches so far (0 before its model loads)."""
        self.reader  # noqa: B018  (a closed index: UsageError)
        return 0 if self._service is None else self._service.model.num_truncated

    @property
    def num_over_chars(self) -> int:
        """Of ``num_truncated``, the texts cut at the characters petal reads of a text, not at the token limit."""
        self.reader  # noqa: B018  (a closed index: UsageError)
        return 0 if self._service is None else self._service.model.num_over_chars

    @property
    def notes(self) -> list[str]:
        """Settings given that do nothing for this index (``nprobe`` without IVF, ``rescore`` without binary codes)."""
        return list(self.reader.ignored)

    @keyword_names()
    @arguments_named("Index.check_where()")
    def check_where(self, where: str) -> None:
        """A ``where`` filter this index can apply (``UsageError`` naming a bad expression or unknown column, or a
        ``where`` that is no str)."""
        _where_text(where)
        try:
            self.reader.selector(where)
        except FilterError as exc:  # NOTE: only the filter's fault is the user's (2); anything else goes up as it is
            raise UsageError(str(exc)) from exc

    @keyword_names()
    def query_model(self) -> QueryService:
        """The index's model, loaded once (gone or different weights: ``ConfigError``, exit 78; an index of
        precomputed vectors has none: ``UsageError``)."""
        refusal = self.manifest.text_query_refusal(self.path)
        if refusal is not None:
            raise UsageError(refusal)
        with self._service_lock:
            if self._service is None:
                from petal.pipeline.jobs.query import QueryService

                try:
                    self._service = QueryService(self.path, reader=self.reader, **self._model_settings)
                except ValueError as exc:  # --device cuda without CUDA, an unknown dtype, a model's own error
                    raise petal_error(exc) from exc
            return self._service

    @keyword_names()
    @arguments_named("Index.reopened()")
    def reopened(self, where: str | None = None) -> Index | None:
        """The index again, on the version ``CURRENT`` names now, when that is another one than the version open
        (``None`` when it is the same, when ``path`` is a version directory or when that version was refused
        before): same settings, its model loaded when this one's is (kept when the new version was built with the
        same model and settings), ``where`` checked against its columns. A version that cannot be opened, or
        searched so, raises as ``open_index``, ``query_model`` and ``check_where`` do, and is not tried again (one the
        host failed, 74, 75 or out of memory, is)."""
        if where is not None:
            _where_text(where)  # NOTE: before the new version is tried: a wrong argument does not refuse it
        pointer = current_pointer(self._root)
        if pointer is None or pointer in (self.reader.dir.name, self._refused):
            return None
        try:
            fresh = Index(self._root, nprobe=self._nprobe, rescore=self._rescore, **self._model_settings)
            fresh._given = self._given
            if where is not None:
                fresh.check_where(where)
            if self._service is not None:
                fresh._service = self._service.on(fresh.reader)
                fresh.query_model()
        except Exception as exc:
            from petal.pipeline.reliability.errors import PetalIOError, TemporaryFailure

            # NOTE: a failure of the host (74: out of memory, no file descriptor left, EIO) says nothing of the
            # version: it is tried again at the next call, not refused for the life of this Index
            if not isinstance(exc, (PetalIOError, TemporaryFailure, MemoryError)):
                self._refused = pointer
            raise
        return fresh

    @keyword_names()
    @arguments_named("Index.search()")
    def search(self, queries: Texts | np.ndarray, k: SupportsIndex = 10,
               where: str | None = None) -> list[list[Hit]]:
        """The top ``k`` hits of each query, best first (fewer when the index holds fewer vectors, or fewer
        documents match ``where``); each hit carries the kept columns (``--keep-columns``) as ``Hit.fields``.

        ``queries``: one text or many (str or UTF-8 bytes: any iterable of them: a list, tuple, generator, numpy
        array, pandas Series, pyarrow array),
        embedded as queries with the index's model, prompt and output settings; a ``None`` or blank one, or one the
        model sees as empty (its tokenizer drops every character, such as combining marks or U+FFFD under MiniLM:
        ``query_model().unseen(texts)`` tells which), gets no hits, in its place, as ``petal query`` skips it
        (``empty_text``), never the hits of an empty text's vector; bytes that are not UTF-8 are read as U+FFFD (as
        ``petal query`` reads them) and answered; one the model embeds to NaN or infinity is a
        ``BadInputError`` (``NonFiniteQueryError``, 65) naming it, before any search. Or the model's float
        vectors ``[num_queries, model dim]`` or ``[model dim]`` as one numpy array or torch tensor
        (``Embedder(model).encode(texts, query=True)``), which get the index's output transform (``--dim``,
        normalisation, quantization); a NaN or infinite value is a ``UsageError``. Anything else (a number, a dict,
        a list of arrays) is a ``TypeError`` (also a ``UsageError``) naming ``queries`` and what it takes.
        ``k``: an integer >= 1 (more than the index holds returns what there is).
        ``where``: only documents matching it, on kept columns (``"lang = 'en' AND year IN (2020, 2021)"``),
        applied inside the FAISS search.
        """
        k = whole_number(k, "k", 1)
        self._check_where(where)
        queries = tensor_array(queries)
        if isinstance(queries, np.ndarray) and queries.dtype.kind not in "USO":
            stored = _in_range(self._stored(queries), self.manifest.metric)
            reader = self.reader
            return _finite_scores(self._searched(lambda: reader.search(stored, k, where=where)), reader)
        # NOTE: petal query's rule (TEXT, --stdin): bytes that are not UTF-8 (bytes, or a str holding them as lone
        # surrogates) are read as U+FFFD and answered; petal embed skips such a text, a query has no row to keep
        texts = query_texts(queries, "queries", "; or vectors: one numpy array or torch tensor [num_queries, dim]")
        asked = [i for i, text in enumerate(texts) if skip_reason(text) is None]
        queried = [text for text in texts if text is not None and skip_reason(text) is None]
        if not texts or (not asked and not self.manifest.precomputed):  # an index without a model refuses texts
            return [[] for _ in texts]
        service = self.query_model()
        from petal.pipeline.jobs.query import NonFiniteQueryError

        try:
            found = self._searched(lambda: service.search(queried, k, where=where))
        except NonFiniteQueryError as exc:  # NOTE: named by its place in ``queries``, not among the texts asked
            raise NonFiniteQueryError(asked[exc.row], exc.text) from None
        hits: list[list[Hit]] = [[] for _ in texts]
        for i, answer in zip(asked, found):
            hits[i] = answer
        return hits

    @keyword_names()
    @arguments_named("Index.search_stored()")
    def search_stored(self, vectors: np.ndarray, k: SupportsIndex = 10, where: str | None = None) -> list[list[Hit]]:
        """Search by vectors as the index stores them (``[num_queries, dim]`` or ``[dim]``, after ``--dim`` and
        normalisation; an index built with ``--vectors-column``: vectors like that column's). No model.
        ``vectors``: a numpy array, a torch tensor (any device or float dtype) or a list of rows; texts are a
        ``TypeError`` (also a ``UsageError``) pointing to ``search``.

        Floats or integers are values. A quantized index also takes its own codes, as ``petal embed --quantize``
        writes them: an ``--quantize int8`` index int8 codes ``[n, dim]`` (decoded by its scheme and ranges), a
        ``--quantize binary`` index packed sign bits uint8 ``[n, dim / 8]`` or bool sign bits ``[n, dim]``.
        Anything else (a wrong width, unsigned values on a binary index, whose sign bits they cannot set) is a
        ``QueryVectorsError`` (a ``UsageError``) saying what this index takes."""
        k = whole_number(k, "k", 1)
        rows = self.query_vectors(vectors)
        self._check_where(where)
        stored = _in_range(rows, self.manifest.metric)
        reader = self.reader
        return _finite_scores(self._searched(lambda: reader.search(stored, k, where=where)), reader)

    @keyword_names()
    @arguments_named("Index.query_vectors()")
    def query_vectors(self, vectors: Any) -> np.ndarray:
        """``vectors`` (see ``search_stored``) as the float32 ``[n, dim]`` rows the index searches with."""
        vectors = _array(vectors)
        rows = vectors[None, :] if vectors.ndim == 1 else vectors
        dim = self.reader.dim
        transform = self.manifest.output
        quantize = transform.quantize if transform is not None else "none"
        takes = f"[num_queries, {dim}] vectors (floats or integers)"
        if quantize == "int8":
            takes += f", or this int8 index's codes (int8 [num_queries, {dim}])"
        elif quantize == "binary":
            takes += (f", or packed sign bits (uint8 [num_queries, {dim // 8}], as petal embed --quantize binary "
                      f"writes) or bool sign bits [num_queries, {dim}]")
        got = f"query vectors of shape {vectors.shape} and type {vectors.dtype}"
        if rows.ndim != 2 or rows.dtype.kind not in "iufb":
            raise QueryVectorsError(f"{got}: this index takes {takes}")
        if transform is not None and quantize == "binary":
            if rows.dtype == np.uint8 and rows.shape[1] == dim // 8 and dim // 8 != dim:
                return _signs(np.unpackbits(rows, axis=1, count=dim).astype(bool), transform.normalized)
            if rows.dtype.kind == "b" and rows.shape[1] == dim:
                return _signs(rows, transform.normalized)
            if rows.dtype.kind == "u" and rows.shape[1] == dim:
                # NOTE: a binary index keeps each value's sign (x >= 0): unsigned values set every bit, whatever
                # they are (an unpacked 0/1 bits file included), and would match documents by chance
                raise QueryVectorsError(f"{got}: unsigned integers have no sign, and this binary index compares "
                                        f"sign bits (every bit would be 1); it takes {takes}")
        if transform is not None and quantize == "int8" and rows.dtype == np.int8 and rows.shape[1] == dim:
            if transform.int8_scheme == "calibrated" and transform.calibration is None and self.num_vectors == 0:
                # NOTE: an empty version records no ranges (nothing to calibrate on); its answer to any query is no
                # hits, as every other empty index's (was 65: "codes cannot be decoded")
                return np.zeros(rows.shape, dtype=np.float32)
            return _decoded_codes(rows, transform)
        if rows.shape[1] != dim or rows.dtype.kind == "b":
            raise QueryVectorsError(f"{got}: this index takes {takes}")
        with np.errstate(over="ignore"):  # float64 beyond float32's range: inf, refused by _finite
            return _finite(np.asarray(rows, dtype=np.float32))

    def _check_where(self, where: Any) -> None:
        if where is None:
            return
        self.check_where(where)

    @staticmethod
    def _searched(work: Any) -> list[list[Hit]]:
        """``work()``; a ``where`` the index cannot apply is a ``UsageError`` (2) naming it. NOTE: only that: another
        ``ValueError`` raised by a search is petal's bug (1, with its traceback), never blamed on the user."""
        try:
            result: list[list[Hit]] = work()
        except FilterError as exc:
            raise UsageError(str(exc)) from exc
        return result

    @keyword_names()
    @arguments_named("Index.texts()")
    def texts(self, hits: list[Hit]) -> list[str | None]:
        """Each hit's text, read back from its shard (``None`` when the shard or row is gone).

        ``hits``: hits of this index's searches (one query's list, or any of them); a hit from another index
        (or a version whose ids differ) is a ``UsageError``, never another document's text."""
        self._check_hits(hits)
        return self.reader.texts(list(hits), self.manifest.columns.text_column)

    def _check_hits(self, hits: Any) -> None:
        """Every hit a ``Hit`` of this version: its FAISS id maps to the same id, shard and row here."""
        if isinstance(hits, Hit) or not isinstance(hits, (list, tuple)):
            raise ArgumentTypeError(f"hits: a list of Hit (one query's, search(...)[0]), not {kind_of(hits)}")
        bad = next((i for i, hit in enumerate(hits) if not isinstance(hit, Hit)), None)
        if bad is not None:
            raise ArgumentTypeError(f"hits[{bad}] is {kind_of(hits[bad])}, not a Hit (search() returns one list of "
                                    "hits per query: pass one of them, search(...)[0])")
        outside = next((hit for hit in hits if not 0 <= hit.faiss_id < self.reader.ntotal), None)
        if outside is None and hits:
            ids, shards, rows = self.reader.id_map.lookup(np.array([hit.faiss_id for hit in hits], dtype=np.int64))
            outside = next((hit for hit, *here in zip(hits, ids, shards, rows)
                            if tuple(here) != (hit.id, hit.shard, hit.row)), None)
        if outside is not None:
            raise UsageError(f"hit {outside.id!r} (FAISS id {outside.faiss_id}) is not a hit of this index "
                             f"({self.path}): pass each index its own hits")

    def _stored(self, vectors: np.ndarray) -> np.ndarray:
        rows = vectors[None, :] if vectors.ndim == 1 else vectors
        transform = self.manifest.output
        width = transform.model_dim if transform is not None else self.reader.dim
        if rows.ndim != 2 or rows.shape[1] != width or rows.dtype.kind != "f":
            # NOTE: an Embedder's output with the index's own --dim or --quantize (int8 codes, sign bits) is in the
            # index's space already: it goes to search_stored, which the error names
            own = self._stored_form(rows)
            raise UsageError(f"query vectors of shape {vectors.shape} and type {vectors.dtype}: this index takes "
                             f"the model's float vectors, [num_queries, {width}]"
                             + (f"; these look like {own}: search them with Index.search_stored" if own else ""))
        with np.errstate(over="ignore"):  # float64 beyond float32's range: inf, refused by _finite
            rows = _finite(np.asarray(rows, dtype=np.float32))
        return transform.stored(rows) if transform is not None else rows


    def _stored_form(self, rows: np.ndarray) -> str | None:
        """What ``rows`` look like when they are in the index's own space (``search_stored`` takes them), else
        ``None``."""
        if rows.ndim != 2:
            return None
        try:
            self.query_vectors(rows)
        except UsageError:
            return None
        transform = self.manifest.output
        quantize = transform.quantize if transform is not None else "none"
        if quantize == "int8" and rows.dtype == np.int8:
            kind = "int8 codes"
        elif quantize == "binary" and rows.dtype.kind in "bu":
            kind = "sign bits"
        else:  # floats or integers of the index's width: its stored vectors' space
            kind = "vectors"
        return f"the index's stored {kind} (dim {self.reader.dim})"


def _where_text(where: Any) -> None:
    """``UsageError`` for a ``where`` that is no str (``None``, bytes, a number): the filter parser takes text only."""
    if not isinstance(where, str):
        raise ArgumentTypeError(f"where {where!r} is {kind_of(where)}, not a filter expression (a str)")


class QueryVectorsError(UsageError):
    """Query vectors an index cannot search with (shape, type, width); ``petal query --vector-file`` says 65."""


def _signs(bits: np.ndarray, normalized: bool) -> np.ndarray:
    """Sign bits ``[n, dim]`` (True: the value was >= 0) as the vectors +-1 (``+-1/sqrt(dim)`` when the index's
    vectors are unit length): the same bits again, and the query's side of the float rescoring."""
    signs = np.where(bits, np.float32(1), np.float32(-1))
    return signs / np.float32(np.sqrt(bits.shape[1])) if normalized else signs


def _decoded_codes(codes: np.ndarray, transform: Any) -> np.ndarray:
    """An int8 index's codes ``[n, dim]`` as its stored vectors: the calibrated ranges decoded (FAISS SQ8's codec),
    or the tanh scheme's values, normalised as the index's vectors are."""
    from petal.pipeline.store.outputs import calibrated_decode, l2_normalize

    if transform.int8_scheme == "calibrated":
        if transform.calibration is None:
            raise QueryVectorsError("this int8 index records no calibration ranges, so its codes cannot be "
                                    "decoded: query it by float vectors")
        rows = calibrated_decode(codes, transform.calibration).astype(np.float32)
    else:
        rows = codes.astype(np.float32)
    return l2_normalize(rows) if transform.normalized else rows


class ScoresOverflowError(UsageError):
    """A query vector whose scores against the index are not finite (``row``: its number in the search). ``reason``:
    why, without the row: the query's values are too large for the index's vectors, or ``oversized``, a stored
    vector too large to score (an index built before ``petal index`` skipped it as ``vector_too_large``)."""

    def __init__(self, row: int, oversized: OversizedVector | None = None) -> None:
        self.reason = oversized.reason() if oversized is not None else (
            "its scores against this index are beyond float32 (its values are too large for the index's vectors); "
            "scale it down")
        super().__init__(f"query vector {row}: {self.reason}")
        self.row = row
        self.oversized = oversized


def _in_range(rows: np.ndarray, metric: str) -> np.ndarray:
    """``rows`` unless an L2 index's distances to one cannot be finite: FAISS works with the query's squared norm in
    float32, and where float32 cannot hold it every distance is inf and FAISS returns no hits at all (a silent empty
    answer); such a row is a ``ScoresOverflowError``. An inner-product index scores such rows (+-inf), which
    ``_finite_scores`` refuses."""
    if metric == "l2":
        over = np.flatnonzero(squared_norm_overflows(rows))
        if len(over):
            raise ScoresOverflowError(int(over[0]))
    return rows


def _finite_scores(found: list[list[Hit]], reader: IndexReader) -> list[list[Hit]]:
    """``found`` (``reader``'s hits) when every score is finite. A query vector whose values float32 holds (up to
    3.4e38) can still have products with the stored vectors that it does not: FAISS scores them +-inf or NaN (which
    JSON has no number for) and ranks them arbitrarily, so such a row is a ``ScoresOverflowError`` (the rule of
    serve's 422), naming the stored vector where that one is too large to score.

    NOTE: a stored vector too large to score (an index built before ``vector_too_large``) was blamed on the query:
    'scale it down', for a unit-length query too."""
    for row, hits in enumerate(found):
        if hits and not np.isfinite([hit.score for hit in hits]).all():
            raise ScoresOverflowError(row, reader.oversized_hit(hits))
    return found


def query_texts(queries: Any, name: str, hint: str = "") -> list[str | None]:
    """Texts to search as ``Index.search`` takes them (``text_items``), each as valid Unicode (``_readable``)."""
    return [_readable(text) for text in text_items(queries, name, hint)]


def _readable(text: str | bytes | None) -> str | None:
    """A query as valid Unicode, its bytes that are not UTF-8 as U+FFFD (``petal query``'s ``valid_text``)."""
    if isinstance(text, bytes):
        return text.decode("utf-8", "replace")
    return None if text is None else valid_text(text)[0]


def tensor_array(value: Any) -> Any:
    """A torch tensor (on any device, bfloat16 included, requiring grad or not) as a numpy array; anything else as it
    is. NOTE: np.asarray of a CUDA or grad tensor raises from inside torch, and numpy has no bfloat16."""
    if not is_tensor(value):
        return value
    tensor = value.detach().cpu()
    if tensor.is_floating_point() and tensor.element_size() < 4:  # float16, bfloat16: float32 (their values exactly)
        tensor = tensor.float()
    return tensor.numpy()


VECTORS_TAKEN = "a numpy array, a torch tensor or a list of rows of numbers, [num_queries, dim] or [dim]"


def _array(vectors: Any) -> np.ndarray:
    vectors = tensor_array(vectors)
    if isinstance(vectors, (str, bytes)) or vectors is None:
        raise ArgumentTypeError(f"vectors: {kind_of(vectors)} is not vectors: vectors takes {VECTORS_TAKEN} (texts "
                                "go to Index.search)")
    if not isinstance(vectors, np.ndarray):
        try:
            vectors = np.asarray(vectors)
        except ValueError as exc:  # ragged lists
            raise UsageError(f"vectors: not an array of [num_queries, dim] numbers ({exc})") from None
    if vectors.dtype.kind in "USO":
        raise ArgumentTypeError(f"vectors: an array of {vectors.dtype} is not vectors: vectors takes {VECTORS_TAKEN} "
                                "(texts go to Index.search)")
    return vectors


def _finite(rows: np.ndarray) -> np.ndarray:
    """``rows`` (float32) when every value is finite; a NaN or infinite one (or one float32 cannot hold) is a
    ``UsageError`` naming the query: FAISS would answer it with no hits or arbitrary ones."""
    finite = np.isfinite(rows).all(axis=1)
    if not finite.all():
        raise UsageError(f"query vector {int(np.argmin(finite))} holds NaN or infinite values (as float32)")
    return rows
