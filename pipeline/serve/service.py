"""What the routes call: the warm model, the batcher, the followed index, and the work each request
needs (tokenization and engine steps on the batcher's thread, searches on the search batcher's),
independent of HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from petal.pipeline.index.filters import FilterError
from petal.pipeline.index.search import Hit, IndexReader, ignored_overrides
from petal.pipeline.jobs.query import QueryModel, SearchIndex, precomputed_message
from petal.pipeline.manifest import Manifest, PrecomputedRecord
from petal.pipeline.reliability.errors import PetalError
from petal.pipeline.serve.batcher import Embedded, ThreadStopped, TokenBatcher, thread_died
from petal.pipeline.serve.encoding import embeddings_body
from petal.pipeline.serve.follower import IndexFollower, OpenFailed
from petal.pipeline.serve.gpu_search import GpuReaders
from petal.pipeline.serve.metrics import ServeMetrics
from petal.pipeline.serve.requests import EmbeddingsRequest, RequestError, SearchRequest, default_k, limit_message
from petal.pipeline.serve.search_batcher import SearchBatcher
from petal.pipeline.serve.searching import SharedExclusiveLock
from petal.pipeline.serve.settings import ServeSettings, model_name
from petal.pipeline.serve.timing import record, span
from petal.pipeline.store.outputs import OutputConfig, OutputTransform, squared_norm_overflows

THREAD_STOP_S = 120.0  # how long stopping waits for the step or search running (a CPU step of a full budget)


def _overflowing_row(found: list[list[Hit]]) -> int | None:
    """The first ``vectors`` row whose scores are not finite, else ``None``: values that float32 holds (the parser
    takes up to 3.4e38) whose products with the stored vectors do not (FAISS scores them +-inf or NaN, which JSON
    has no number for, and ranks them arbitrarily)."""
    return next((row for row, hits in enumerate(found) if hits and not np.isfinite([hit.score for hit in hits]).all()),
                None)


def _overflow_refused(row: int, hits: list[Hit], reader: IndexReader) -> RequestError:
    """The 422 of ``vectors`` row ``row`` (its ``hits`` from ``reader``) whose scores are not finite: the row is too
    large, or a stored vector is (``IndexReader.oversized_hit``: an index built before ``vector_too_large``).
    NOTE: a stored vector too large to score was blamed on the row ('scale the row down', a unit-length one too)."""
    oversized = reader.oversized_hit(hits)
    if oversized is not None:
        return RequestError(422, f"'vectors' row {row}: {oversized.reason()}")
    return RequestError(422, f"'vectors' row {row}: its scores against this index are beyond float32 (the values "
                             "are too large for its vectors); scale the row down")


def _l2_in_range(vectors: np.ndarray) -> None:
    """``RequestError`` 422 for a ``vectors`` row of an L2 index whose squared norm float32 cannot hold: FAISS works
    with it in float32, every distance is inf and FAISS drops them all (an empty answer, 200, where ``petal query
    --vector-file`` refuses the row)."""
    over = np.flatnonzero(squared_norm_overflows(vectors))
    if len(over):
        raise RequestError(422, f"'vectors' row {int(over[0])}: its distances to this index's vectors are beyond "
                                "float32 (its squared norm is); scale the row down")


def _where_refused(exc: FilterError) -> RequestError:
    """The 422 of a ``where`` the index cannot apply (its message names the request's field, not the flag).
    NOTE: only a ``FilterError``: another ``ValueError`` raised by a search is the server's fault (500), not the
    client's."""
    return RequestError(422, str(exc).replace("--where", "'where'", 1), param="where")


def _not_codes(vectors: np.ndarray, manifest: Manifest) -> None:
    """``RequestError`` 422 for a ``vectors`` row of a quantized index that holds its codes, not vectors: whole numbers
    past 1 on an int8 index (its int8 codes, what ``petal embed --quantize int8`` writes) or only 0s and 1s on a
    binary index (unpacked sign bits). JSON numbers are taken as floats in the index's space, so such a row was
    searched as a vector: other hits, scores in the hundreds, no error (``petal query --vector-file`` and
    ``Index.search_stored`` decode codes by their dtype, which JSON has not)."""
    quantize = manifest.output.quantize if manifest.output is not None else "none"
    if quantize not in ("int8", "binary") or not len(vectors):
        return
    whole = np.all(vectors == np.rint(vectors), axis=1)
    if quantize == "int8":
        largest = np.abs(vectors).max(axis=1)
        codes = whole & (largest > 1) & (largest <= 128)
        what = "this int8 index's codes (whole numbers from -128 to 127)"
    else:
        codes = np.all((vectors == 0) | (vectors == 1), axis=1) & np.any(vectors == 0, axis=1)
        what = "this binary index's sign bits as 0s and 1s"
    if codes.any():
        row = int(np.argmax(codes))
        raise RequestError(422, f"'vectors' row {row} looks like {what}: /search takes float vectors in the "
                                "index's space, before quantization (what /v1/embeddings returns with dimensions "
                                "the index's dim); search codes or bits with petal query --vector-file or "
                                "Index.search_stored")


def _vectors_column(manifest: Manifest) -> tuple[str, ...]:
    """The column an index of precomputed vectors (``--vectors-column``) read its vectors from (none for a text
    index)."""
    column = manifest.columns.vectors_column
    if column is None and isinstance(manifest.model, PrecomputedRecord):
        column = manifest.model.vectors_column
    return () if column is None else (column,)


@dataclass(frozen=True)
class Tokens:
    ids: list[np.ndarray]

    @property
    def count(self) -> int:
        return sum(len(x) for x in self.ids)


def checked_token_ids(lists: tuple[np.ndarray, ...], vocab: int, max_tokens: int, model_id: str,
                      truncate: bool) -> Tokens:
    """``/v1/embeddings``' token-id lists (``requests.EmbeddingsRequest.token_ids``) as the engine takes them: 422 for
    an id outside the model's vocabulary, 413 for a list over ``max_tokens`` (cut to it with ``truncate``). NOTE: numpy
    tests each list at once; a Python test of each id took ~4 ms of the event loop for 256 lists of 512 ids."""
    out = []
    for i, ids in enumerate(lists):
        if ids.min() < 0 or ids.max() >= vocab:
            bad = ids[np.flatnonzero((ids < 0) | (ids >= vocab))[0]]
            # NOTE: the usual cause is another tokenizer's ids: LangChain's OpenAIEmbeddings sends tiktoken's
            raise RequestError(422, f"input item {i}: token id {bad} is outside the vocabulary (0..{vocab - 1}) "
                                    f"of {model_id}: token ids are its own tokenizer's; send the text instead "
                                    "(LangChain's OpenAIEmbeddings sends tiktoken's ids unless "
                                    "check_embedding_ctx_length=False)")
        if len(ids) > max_tokens:
            if not truncate:
                raise RequestError(413, limit_message("input", i, max_tokens))
            ids = ids[:max_tokens]
        out.append(ids.astype(np.int32))
    return Tokens(out)


class ServeState:
    """One server's warm state. ``start()`` in the event loop, ``stop()`` after the last request.

    ``model`` ``None``: an index of precomputed vectors (``--vectors-column``) served without ``--model``: ``/search``
    by ``vectors`` only, no ``/v1/embeddings``, no engine thread (and no torch). With a model, such an index still
    takes only vectors on ``/search`` (``petal query``'s rule: nothing says its vectors came from that model); the
    model serves ``/v1/embeddings``."""

    def __init__(self, model: QueryModel | None, settings: ServeSettings, index_root: Path | None = None,
                 index: SearchIndex | None = None, nprobe: int | None = None, rescore: int | None = None,
                 metrics: ServeMetrics | None = None, query_prompt_fixed: bool = False) -> None:
        """``query_prompt_fixed``: the query prompt was given (``--query-prompt``), not read from the index."""
        assert model is not None or (index is not None and index.precomputed), "only an index of vectors needs no model"
        self.model = model
        self.settings = settings
        self.metrics = metrics if metrics is not None else ServeMetrics()
        self.model_id = None if model is None else settings.served_model_name or model_name(model.spec.path)
        self.batcher = None if model is None else TokenBatcher(
            model.engine, self.metrics, settings.max_wait_ms, settings.max_queue_texts,
            tokenizers=dict(model.tokenizers), spin_ms=settings.engine_spin_ms)
        # the GPU copy of each version (--search-device cuda), made before the version serves
        self.gpu = None if settings.search_device == "cpu" else GpuReaders(
            settings.search_device, settings.search_dtype, settings.search_exact, default_k(settings.limits.max_k))
        if index is not None:  # NOTE: the first version's errors as they are: 65 for a damaged file, at start
            index.reader.id_map.decode_all()
            if self.gpu is not None:
                self.gpu.prepare(index.reader)
        # NOTE: an index of vectors is followed by its own rules (dim, metric, stored format), whatever model is loaded
        spec = None if model is None or index is None or index.precomputed else model.spec
        self.follower = None if index is None or index_root is None else IndexFollower(
            index_root, spec, index, self.metrics, nprobe=nprobe, rescore=rescore, prepare=self._prepare,
            query_prompt_fixed=query_prompt_fixed)
        self.executor = ThreadPoolExecutor(settings.search_threads, thread_name_prefix="petal-work")
        self.params_lock = SharedExclusiveLock()
        self.searcher = SearchBatcher(self.params_lock, self.gpu, max_queue_rows=settings.max_queue_texts)
        self._follow_task: asyncio.Task[None] | None = None
        self._transforms: dict[int | None, OutputTransform] = {}
        # set by the server before start(): the engine or search thread ended on an unexpected error (stop serving)
        self.on_failure: Callable[[ThreadStopped], None] = lambda stopped: None

    def _prepare(self, reader: IndexReader) -> None:
        """A new version's warm state, made before it serves (the follower's hook): its id map decoded (no search pays
        a row group's first decode; a damaged one is ``OpenFailed``) and, with --search-device cuda, its GPU copy."""
        try:
            reader.id_map.decode_all()
        except PetalError as exc:  # NOTE: ids.parquet damaged past its head/tail checksums: the version's file
            raise OpenFailed(str(exc)) from exc
        if self.gpu is not None:
            self.gpu.prepare(reader)

    async def start(self) -> None:
        if self.batcher is not None:
            self.batcher.on_death = self._thread_stopped
            self.batcher.start()
        self.searcher.on_death = self._thread_stopped
        self.searcher.start()
        if self.follower is not None:
            self._follow_task = asyncio.create_task(self._follow(self.follower))

    async def _follow(self, follower: IndexFollower) -> None:
        """The follower's polling; an unexpected error that ends it (past its per-check guard) stops the server, as
        the engine and search threads' do: a server that no longer follows would serve its version forever."""
        try:
            await follower.follow(self.settings.reload_interval_s)
        except Exception as exc:  # NOTE: a cancel (the server stopping) is not caught
            thread_died("version follower", exc, self._thread_stopped)

    def _thread_stopped(self, stopped: ThreadStopped) -> None:
        self.on_failure(stopped)  # NOTE: read when it happens: the server sets it once the state is made

    async def stop(self) -> None:
        """(the event loop, after the last request) Stop following and stop the threads."""
        if self._follow_task is not None:
            self._follow_task.cancel()
        await asyncio.to_thread(self.close_threads)

    def close_threads(self, timeout_s: float = THREAD_STOP_S) -> bool:
        """(any thread; again is a no-op) Stop the engine and search threads and the search pool: what is still
        queued is answered 503, the step or search running finishes. True once both threads have ended.

        NOTE: the process must not end while the engine thread is inside a step: a native thread pool torn down
        under it aborts the interpreter (exit 134, "terminate called without an active exception")."""
        stopped = self.batcher.close(timeout_s) if self.batcher is not None else True
        stopped = self.searcher.close(timeout_s) and stopped
        self.executor.shutdown(wait=False, cancel_futures=True)
        return stopped

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # --- tokens ---------------------------------------------------------------------------------

    async def embed_texts(self, texts: tuple[str, ...], side: str, truncate: bool, name: str,
                          then: Callable[[np.ndarray, bool], None] | None = None) -> Embedded:
        """Model vectors of ``texts``: tokenized and embedded on the engine thread (spans ``tokenize`` and
        ``engine``: queue and step); ``then`` as ``TokenBatcher.embed_texts``."""
        assert self.batcher is not None, "a server without a model embeds nothing (require_model)"
        started = time.perf_counter()
        embedded = await self.batcher.embed_texts(texts, side, truncate, name, then)
        record("tokenize", embedded.tokenize_s)
        record("engine", time.perf_counter() - started - embedded.tokenize_s)
        return embedded

    def token_ids(self, lists: tuple[np.ndarray, ...], truncate: bool) -> Tokens:
        assert self.model is not None and self.model_id is not None
        return checked_token_ids(lists, self.model.spec.config.vocab_size, self.model.max_tokens, self.model_id,
                                 truncate)

    # --- embeddings -----------------------------------------------------------------------------

    def _transform(self, dimensions: int | None) -> OutputTransform:
        assert self.model is not None
        if dimensions not in self._transforms:
            if dimensions is not None and dimensions > self.model.dim:
                raise RequestError(422, f"'dimensions' is {dimensions}, the model has {self.model.dim}")
            self._transforms[dimensions] = OutputTransform.for_model(self.model.spec, OutputConfig(dim=dimensions))
        return self._transforms[dimensions]

    def require_model(self) -> None:
        """``RequestError`` 404 on a server without a model (an index of precomputed vectors served without
        ``--model``), before its body is read."""
        if self.model is None:
            live = self.follower.live if self.follower is not None else None
            what = f": {precomputed_message(live.reader.manifest)}" if live is not None else ""
            raise RequestError(404, f"this server has no model, so no /v1/embeddings (it serves an index of "
                                    f"precomputed vectors{what}); /search takes 'vectors'; start the server with "
                                    "--model DIR to serve /v1/embeddings", kind="not_found")

    async def embeddings(self, req: EmbeddingsRequest) -> bytes:
        """The answer's JSON body (encoded here: the float rows go straight from numpy to JSON text)."""
        self.require_model()
        assert self.model is not None and self.batcher is not None and self.model_id is not None
        if req.model is not None and req.model != self.model_id:
            raise RequestError(404, f"model {req.model!r} is not served here (this server serves {self.model_id!r})",
                               kind="model_not_found", param="model")
        transform = self._transform(req.dimensions)
        if req.texts is not None:
            embedded = await self.embed_texts(req.texts, req.input_type, req.truncate, "input")
            model_rows, count = embedded.rows, embedded.tokens
        else:
            assert req.token_ids is not None
            tokens = self.token_ids(req.token_ids, req.truncate)
            with span("engine"):
                model_rows = await self.batcher.embed(tokens.ids)
            count = tokens.count
        with span("encode"):
            return embeddings_body(self.model_id, transform.vectors(model_rows), req.encoding_format, count)

    # --- search ---------------------------------------------------------------------------------

    def require_index(self) -> None:
        """``RequestError`` 404 on a server without an index (``--model`` only), before its body is read."""
        if self.follower is None:
            raise RequestError(404, "this server has no index (started with --model only): use /v1/embeddings",
                               kind="not_found")

    async def _build_selector(self, index: SearchIndex, where: str) -> None:
        """``where``'s selector built (and cached for the search) in the work pool, or its 422. NOTE: not on the one
        search thread every request's search waits on: a long filter held them all while it was built."""
        try:
            await self._in_thread(index.reader.selector, where)
        except FilterError as exc:
            raise _where_refused(exc) from exc

    async def search(self, req: SearchRequest) -> dict[str, Any]:
        self.require_index()
        assert self.follower is not None
        index = self.follower.live  # NOTE: taken once: the whole answer comes from this version
        if req.texts is not None and index.precomputed:
            raise RequestError(422, self.texts_refused(index, f"'{req.field}'"), param=req.field)
        if req.texts is not None and req.where is not None:
            await self._build_selector(index, req.where)  # NOTE: a bad filter is 422 before its texts are embedded
        if req.texts is not None:
            # NOTE: admitted to the search queue first (a 503 costs no embedding); the engine thread queues the
            # search itself as soon as the step's rows are read (the model vectors go through the index-time
            # transform there): no event-loop round trip between the step and the search
            ticket = self.searcher.reserve(index, len(req.texts), req.k, where=req.where, nprobe=req.nprobe,
                                           rescore=req.rescore)
            # a lone one on a GPU copy is searched right there, on the engine thread (SearchTicket.submit)
            try:
                await self.embed_texts(req.texts, "query", req.truncate, req.field, then=ticket.submit)
            finally:
                ticket.cancel()  # NOTE: a no-op once submitted; a failed or cancelled embedding frees its place
            if ticket.inline_s:  # NOTE: that search ran inside the engine span: moved to its own span
                record("engine", -ticket.inline_s)
                record("search", ticket.inline_s)
            pending: Awaitable[list[list[Hit]]] = ticket.hits()
        else:
            assert req.vectors is not None
            vectors = req.vectors
            if vectors.ndim != 2 or vectors.shape[1] != index.reader.dim:
                raise RequestError(422, f"'vectors' rows must have {index.reader.dim} values (the index's dim), "
                                        f"got [{vectors.shape[-1]}]")
            _not_codes(vectors, index.reader.manifest)
            if index.reader.manifest.metric == "l2":
                _l2_in_range(vectors)
            if req.where is not None:
                await self._build_selector(index, req.where)
            pending = self.searcher.search(index, vectors, False, req.k, where=req.where, nprobe=req.nprobe,
                                           rescore=req.rescore)
        try:
            with span("search"):
                found = await pending
        except FilterError as exc:  # a bad filter or an unknown column, named (as the request's field)
            raise _where_refused(exc) from exc
        # NOTE: any other error (a ValueError too) is the server's: 500, logged
        overflowing = _overflowing_row(found) if req.vectors is not None else None
        if overflowing is not None:  # NOTE: off the event loop: an IVF index without a direct map reads its lists
            raise await self._in_thread(_overflow_refused, overflowing, found[overflowing], index.reader)
        if req.include:  # reads stored text or the shards: off the event loop
            results = await self._in_thread(self._results, index, found, req)
        else:
            results = self._results(index, found, req)
        # NOTE: "model": what embedded the queries (none for an index of vectors: the rows were the client's)
        answer: dict[str, Any] = {"version": index.version, "model": None if index.precomputed else self.model_id,
                                  "results": results}
        # an override this version's index has no use for (nprobe of a Flat one): said, not refused, since
        # `--index-factory auto` can turn Flat into IVF (or back) from one re-index to the next
        ignored = ignored_overrides(index.reader.manifest, req.nprobe, req.rescore)
        if ignored:
            answer["ignored"] = [note.replace("--nprobe", "'nprobe'").replace("--rescore", "'rescore'")
                                 for note in ignored]
        return answer

    def texts_refused(self, index: SearchIndex, field: str) -> str:
        """The 422 of texts on ``/search`` of an index of precomputed vectors (``petal query``'s rule, with the
        same message)."""
        hint = ""
        if self.model_id is not None:
            hint = (f"; the server's model ({self.model_id!r}) serves /v1/embeddings only: petal cannot know that "
                    "this index's vectors came from it (embed with it and send the rows as 'vectors' if they did)")
        return (f"{precomputed_message(index.reader.manifest)}: send 'vectors' (rows of {index.reader.dim} values, in "
                f"the index's space) instead of {field}{hint}")

    def _results(self, index: SearchIndex, found: list[list[Hit]], req: SearchRequest) -> list[dict[str, Any]]:
        reader = index.reader
        results = []
        for q, hits in enumerate(found):
            rows = [{"rank": h.rank, "score": h.score, "id": h.id, "shard": h.shard, "row": h.row} for h in hits]
            if reader.kept_columns:  # --keep-columns: stored with the index, on every hit
                for row, hit in zip(rows, hits):
                    row["fields"] = hit.fields
            if req.include:
                text_column = index.text_column
                # NOTE: the columns the index was built from are not metadata: the text (its own field) and, for an
                # index of precomputed vectors, the vectors column (the input, not the row's description)
                inputs = {text_column, *_vectors_column(reader.manifest)}
                # the text stored with the index (any index built with text): no source shard needed
                stored = reader.columns is not None and "text" in reader.columns.names
                from_shard = "text" in req.include and not stored  # the text read with the metadata, if asked
                # NOTE: only the columns returned are read (and the id, checked): a shard's vectors column, a list
                # of dim floats a row, decoded for its row group, held the row group's vectors in memory at once
                records = (reader.records(hits, exclude=tuple(inputs - {text_column} if from_shard else inputs))
                           if "metadata" in req.include else reader.records(hits, [text_column]) if not stored
                           else [None] * len(hits))
                texts = reader.texts(hits, text_column) if stored and "text" in req.include else None
                for i, (row, record) in enumerate(zip(rows, records)):
                    if "text" in req.include:
                        row["text"] = texts[i] if texts is not None else (
                            None if record is None else record.get(text_column))
                    if "metadata" in req.include:
                        row["metadata"] = None if record is None else {
                            k: v for k, v in record.items() if k not in inputs}
            result: dict[str, Any] = {"hits": rows}
            if req.texts is not None:
                result = {"query": req.texts[q], **result}
            results.append(result)
        return results

    def search_copy(self, live: SearchIndex | None = None) -> dict[str, Any] | None:
        """How ``live`` (default: the live version) is searched (``None``: no index): FAISS on the CPU, or a GPU copy
        and its dtype (``dtype_reason``: why it is float32 where float16 was asked for). Also set as
        ``petal_search_copy``."""
        if self.follower is None:
            return None
        live = self.follower.live if live is None else live
        found = self.gpu.describe(live.reader) if self.gpu is not None else {"device": "cpu", "copy": None}
        self.metrics.searching(live.version, str(found["device"]), str(found["copy"] or "none"),
                               str(found.get("dtype", "none")))
        return found

    def metrics_body(self) -> bytes:
        """``/metrics``: ``petal_search_copy`` set from the live version, rendered with the same version's
        ``petal_index_version``. NOTE: a swap sets the live version, then its gauges (the follower's thread): a scrape
        in between read one version's search copy beside the other's version."""
        with self.metrics.swapping():  # NOTE: a swap (follower.swap_to) waits for this scrape, and it for a swap
            self.search_copy()
            return self.metrics.render()

    def ready(self) -> dict[str, Any]:
        """``/ready``: the model (``null``: none loaded), the version served, how it is searched, and what
        ``/search`` takes (``search_by``: an index of precomputed vectors takes only vectors)."""
        out: dict[str, Any] = {"status": "ready", "model": self.model_id,
                               "device": None if self.model is None else str(self.model.engine.device)}
        if self.follower is not None:
            live = self.follower.live  # NOTE: read once: a swap on the reload thread must not mix two versions
            out.update(self.follower.status(live))
            out["search"] = self.search_copy(live)
            out["search_by"] = ["vectors"] if live.precomputed else ["query", "queries", "vectors"]
            recorded = live.reader.manifest.model
            if live.precomputed:
                out["precomputed"] = {"vectors_column": getattr(recorded, "vectors_column", None),
                                      "dim": live.reader.dim, "metric": live.reader.manifest.metric}
        return out
