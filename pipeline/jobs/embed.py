"""Embedding texts in order: ``petal.Embedder`` (``petal embed``), and ``encode_texts`` (queries, benchmarks)."""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsIndex

import numpy as np

from petal.engine.config import EngineConfig, ModelOptions, device_problem
from petal.pipeline.config import IndexJob, check_lengths, default_token_budget
from petal.pipeline.ingest.pack import PackConfig, pack, plan_batches
from petal.pipeline.ingest.text_rule import skip_reason, undecodable_text_reason, valid_text
from petal.pipeline.ingest.tokens import Encoded, TextTokenizer, tokenizer_for
from petal.pipeline.jobs.settings import (
    Texts,
    build,
    check_model_settings,
    kind_of,
    model_options,
    model_path,
    out_path,
    petal_error,
    text_items,
    typed,
    whole_number,
)
from petal.pipeline.reliability.errors import (
    ArgumentTypeError,
    BadInputError,
    UsageError,
    arguments_named,
    keyword_names,
    quote_text,
)
from petal.pipeline.store.outputs import OutputConfig, OutputTransform

if TYPE_CHECKING:
    # NOTE: torch comes with the engine, imported where the Embedder builds one: a bad setting is refused first
    from petal.engine.engine import Engine
    from petal.engine.lazy_tensor import LazyTensor
    from petal.engine.loader import ModelSpec

    EngineFactory = Callable[[ModelSpec, EngineConfig], Engine]

# A CPU step of at most this many tokens (a query, a short text) runs on one intra-op thread: its GEMMs are too
# small to share, and on a loaded 2-core machine waking a second OpenMP thread for every op costs more than the
# whole step (a 6-token forward under load: 0.24-0.59 s on 2 threads, 0.014-0.033 s on 1; idle: 10 ms on 2,
# 11-16 ms on 1; at 128 tokens idle: 29 ms on 2, 44 ms on 1).
SMALL_STEP_TOKENS = 64

# NOTE: an engine is not reentrant: its CUDA graphs replay from one set of static input buffers and write into
# one ring of result slots, and a CPU step sets torch's process-wide thread count. Two threads stepping one
# engine at once (a web app sharing an Embedder or an Index) would mix each other's inputs and rows, silently.
# Every step of this module runs under the engine's lock; petal serve steps its engine from one thread only.
_ENGINE_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_LOCKS_LOCK = threading.Lock()


def engine_lock(engine: Engine) -> threading.Lock:
    """The lock that one caller at a time holds to step ``engine`` (made at first use)."""
    with _LOCKS_LOCK:
        lock = _ENGINE_LOCKS.get(engine)
        if lock is None:
            lock = _ENGINE_LOCKS[engine] = threading.Lock()
        return lock


def encode_texts(engine: Engine, tokenizer: TextTokenizer, texts: list[str],
                 batch_tokens: int | None = None) -> tuple[np.ndarray, int]:
    """``[len(texts), dim]`` float32 in input order, and how many texts were truncated.

    Batches hold up to ``batch_tokens`` tokens (default: the engine's token budget). Text that is not
    valid Unicode is embedded with U+FFFD in place of the bad bytes (callers that read it count and say
    so); it never fails the call.
    """
    if not texts:
        return np.zeros((0, engine.dim), dtype=np.float32), 0
    encoded = _tokenized(tokenizer, [valid_text(t)[0] for t in texts])
    return embed_token_ids(engine, encoded.token_ids, batch_tokens), int(encoded.truncated.sum())


def _tokenized(tokenizer: TextTokenizer, texts: list[str]) -> Encoded:
    """``texts``' token ids; a text that yields none is bad input, named by its index in ``texts``."""
    encoded = tokenizer.encode(texts)
    empty = [i for i, ids in enumerate(encoded.token_ids) if len(ids) == 0]
    if empty:
        place = empty[0]
        raise BadInputError(f"text {place} ({quote_text(texts[empty[0]])}) yields no tokens")
    return encoded


def seen_texts(tokenizer: TextTokenizer, texts: list[str]) -> tuple[Encoded, list[int]]:
    """``texts``' token ids, and the positions of those the model sees as empty (no ids, or an empty text's:
    ``TextTokenizer.sees_nothing``), which ``petal index`` skips as ``empty_text`` and so ``petal embed`` does."""
    encoded = tokenizer.encode(texts) if texts else Encoded([], np.zeros(0, dtype=bool))
    return encoded, [i for i, ids in enumerate(encoded.token_ids) if len(ids) == 0 or tokenizer.sees_nothing(ids)]


def embed_token_ids(engine: Engine, token_ids: list[np.ndarray], batch_tokens: int | None = None) -> np.ndarray:
    """``[len(token_ids), dim]`` float32 in input order: packed batches of up to ``batch_tokens`` tokens (default:
    the engine's token budget), ``steps_in_flight`` steps queued while the host packs the next. Safe to call from
    several threads: they take turns on the engine (``engine_lock``)."""
    config = PackConfig(batch_tokens or engine.config.token_budget, engine.config.max_seqs)
    out = np.empty((len(token_ids), engine.dim), dtype=np.float32)
    in_flight: deque[tuple[list[int], LazyTensor]] = deque()
    with engine_lock(engine):  # one caller's steps at a time, every result read before the next caller's
        for batch in pack(enumerate(token_ids), config):
            with _step_threads(engine, batch.num_tokens):
                in_flight.append((list(batch.keys), engine.step(batch)))
            while len(in_flight) > engine.config.steps_in_flight:
                keys, lazy = in_flight.popleft()
                out[keys] = lazy.result()
        for keys, lazy in in_flight:
            out[keys] = lazy.result()
    return out


@contextmanager
def _step_threads(engine: Engine, num_tokens: int) -> Iterator[None]:
    """One intra-op thread for a small step on the CPU (``SMALL_STEP_TOKENS``); the setting is put back after."""
    if engine.config.device != "cpu" or num_tokens > SMALL_STEP_TOKENS:
        yield
        return
    import torch

    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class Embedded:
    """One ``Embedder.embed`` call: the rows, and what a caller may want to report about them."""

    rows: np.ndarray  # float32/float16 vectors, int8 codes or packed sign bits, in input order
    truncated: int  # texts cut at the model's max length (or, ``over_chars`` of them, at the characters petal reads)
    transform: OutputTransform  # the output format the rows are in (with the int8 ranges used)
    learned_ranges: bool  # calibrated int8 ranges were learned from these very texts
    skipped: dict[int, str] = field(default_factory=dict)  # input position -> why it was not embedded (null_text, ...)
    start: int = 0  # the input position of rows[0] (``Embedder.embed_stream``'s answers; 0 for ``embed``)
    # of ``truncated``, the texts cut at ``Embedder.max_text_chars`` characters, which hold fewer tokens than the
    # max length (one huge unknown word): not at the max length
    over_chars: int = 0


class Embedder:
    """Texts -> vectors with petal's tokenizer, packed batches and engine (sentence-transformers-like).

    ``model``: a local model directory or a cached Hugging Face id (default: the packaged
    all-MiniLM-L6-v2). ``device``: auto, cpu or cuda; ``dtype``: auto, float32, bfloat16 or float16.
    The other settings are those of ``petal embed`` (``dim``, ``quantize``, ``output_dtype``, ``pooling``,
    ``attention_mask``, ``query_prompt``, ``max_length``, ``calibration`` = an index whose int8 ranges to
    use, ...). A bad setting raises ``petal.UsageError`` (a ``ValueError``); a model that is missing or
    unsafe ``petal.ConfigError``; the model loads here, once.
    """

    @keyword_names()
    @arguments_named("petal.Embedder()")
    def __init__(self, model: str | Path | None = None, device: str = "auto", dtype: str = "auto", *,
                 attention: str = "auto", max_length: int | None = None, token_budget: int | None = None,
                 max_seqs: int = 256, cuda_graphs: bool = True, pooling: str | None = None,
                 attention_mask: str | None = None, query_prompt: str | None = None,
                 allow_pickle_weights: bool = False, dim: int | None = None, quantize: str = "none",
                 output_dtype: str = "float32", calibration: str | Path | None = None,
                 engine_factory: EngineFactory | None = None) -> None:
        caller = "petal.Embedder()"
        if engine_factory is not None and not callable(engine_factory):  # NOTE: else a TypeError once the model loads
            raise ArgumentTypeError(f"{caller}: engine_factory={engine_factory!r} is {kind_of(engine_factory)}, "
                                    "not callable")
        if model is not None:  # NOTE: a file:// URL is the local directory it names (was looked for at ./file:/...)
            model = model_path(model, f"{caller}: model")
        # NOTE: before torch: device=1 was 'device 1 is not one of ...' from the engine, a ValueError, not a TypeError
        check_model_settings({"device": device, "dtype": dtype, "attention": attention}, caller)
        if calibration is not None:  # NOTE: file:// the local index, another URL a UsageError (as --calibration)
            calibration = out_path(calibration, f"{caller}: calibration")
        options = model_options(**typed(ModelOptions, {
            "pooling": pooling, "attention_mask": attention_mask, "query_prompt": query_prompt,
            "allow_pickle_weights": allow_pickle_weights}, caller))
        output = build(OutputConfig, **typed(OutputConfig, {"dim": dim, "quantize": quantize,
                                                            "output_dtype": output_dtype}, caller))
        if calibration is not None and quantize != "int8":
            raise UsageError("--calibration goes with --quantize int8")
        lengths = typed(IndexJob, {"max_length": max_length, "token_budget": token_budget, "max_seqs": max_seqs,
                                   "cuda_graphs": cuda_graphs}, caller)
        max_length, token_budget, max_seqs = lengths["max_length"], lengths["token_budget"], lengths["max_seqs"]
        build(check_lengths, max_length, token_budget, max_seqs)
        from petal.pipeline.jobs.model import model_spec
        self.spec = model_spec(os.fspath(model) if model is not None else None, max_length, options)
        transform: OutputTransform = build(OutputTransform.for_model, self.spec, output)
        if calibration is not None and transform.int8_scheme == "calibrated":
            transform = index_calibration(self.spec, transform, Path(calibration))
        self.transform = transform
        if token_budget is not None and token_budget < self.spec.pooling.max_length:
            # NOTE: before torch (was the engine's refusal, the model's weights loading first)
            raise UsageError(f"token budget {token_budget} < max length {self.spec.pooling.max_length}: raise "
                             "token_budget or lower max_length")
        self._tokenizers: dict[str, TextTokenizer] = {}
        if max_length is not None or query_prompt is not None:
            # NOTE: the room a max_length or prompt leaves for text (FlagError, 2) before torch and the model load
            # (was found at the first encode, the model loaded); the tokenizers are kept for it
            for side in ("query", "document"):
                self._tokenizer(side)
        # NOTE: device="cpu" with a dtype or attention only CUDA runs: refused before torch loads, as the CLI does
        problem = device_problem(device, dtype, attention) if isinstance(device, str) else None
        if problem is not None:
            raise UsageError(problem.replace("--dtype ", "dtype ").replace("--attention ", "attention "))
        # NOTE: torch is imported once the model's files and the output settings were judged
        from petal.engine.engine import Engine, attention_backend, resolve_device, resolve_dtype
        try:
            dev = resolve_device(device)
            config = EngineConfig(device=dev, dtype=resolve_dtype(dtype, dev), attention=attention_backend(attention),
                                  cuda_graphs=cuda_graphs, max_seqs=max_seqs,
                                  token_budget=token_budget or default_token_budget(dev, self.spec.pooling.max_length))
            self._engine: Engine | None = (engine_factory or Engine)(self.spec, config)
        except ValueError as exc:
            raise petal_error(exc) from exc

    @property
    def engine(self) -> Engine:
        """The model's engine (``UsageError`` after ``close()``)."""
        if self._engine is None:
            raise UsageError("this Embedder was closed: make a new one (petal.Embedder(...))")
        return self._engine

    def close(self) -> None:
        """Let the model go: its engine (weights, CUDA graphs, pinned buffers) is freed once nothing else holds it.
        Encoding afterwards raises ``UsageError``; closing again does nothing. Also the end of a
        ``with petal.Embedder(...) as embedder:`` block."""
        self._engine = None  # NOTE: the tokenizers stay (small): a thread inside embed() may be reading them

    def __repr__(self) -> str:
        engine = self._engine
        where = "closed" if engine is None else f"device={engine.config.device!r} dtype={engine.config.dtype!r}"
        return (f"<petal.Embedder model={str(self.spec.path)!r} dim={self.dim} quantize={self.transform.quantize!r} "
                f"max_length={self.max_length} {where}>")

    def __enter__(self) -> Embedder:
        self.engine  # noqa: B018  (a closed Embedder: UsageError, as every other use and as a closed Index's)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def dim(self) -> int:
        """Dimensions of a vector (``dim`` or the model's width); binary rows hold ``dim / 8`` bytes."""
        return self.transform.dim

    @property
    def max_length(self) -> int:
        """Tokens per text; longer texts are truncated."""
        return self.spec.pooling.max_length

    @property
    def max_text_chars(self) -> int:
        """Characters petal reads of a text, from its first token: a longer one whose ``max_text_chars`` characters
        from there hold fewer tokens than ``max_length`` is embedded from them (``Embedded.over_chars``)."""
        return self._tokenizer("document").max_text_chars

    @arguments_named("Embedder.encode()")
    def encode(self, texts: Texts, *, query: bool = False, batch_tokens: SupportsIndex | None = None) -> np.ndarray:
        """``[len(texts), dim]`` rows in input order (one text: ``[1, dim]``; packed sign bits: ``[len(texts),
        dim // 8]``; ``dim`` is ``self.dim``: the ``dim`` setting, else the model's width). A null, undecodable
        (bytes that are not UTF-8, a str holding surrogates) or blank text, or one the model turns into NaN or
        infinity, is skipped (the rule of ``petal index``): its row is NaN (zeros for int8 codes and sign bits).

        ``query=True`` embeds the texts as queries (the model's or ``query_prompt``'s prompt in front).
        ``batch_tokens`` caps the tokens of one packed batch (from the model's max length up to the
        engine's token budget). Rows are float32 (``output_dtype="float16"``: float16), int8 codes
        (``quantize="int8"``) or packed sign bits (``quantize="binary"``, uint8, first dimension in the high bit).
        """
        return self.embed(texts, query=query, batch_tokens=batch_tokens).rows

    @keyword_names()
    def embed(self, texts: Texts, *, query: bool = False, batch_tokens: SupportsIndex | None = None) -> Embedded:
        """``encode``, with the number of truncated texts, the skipped ones and the output format used.

        ``texts``: one text (a str or UTF-8 bytes: ``[1, dim]``) or an ordered collection of them (a list, tuple,
        generator, numpy array, pandas Series, pyarrow array); anything else (a dict, a set, numbers such as a
        torch tensor, an item that is not a str) is a ``TypeError`` (also a ``UsageError``) naming ``texts`` and
        what it takes. ``None``, undecodable and invisible texts,
        and texts the model turns into NaN or infinity, are skipped and said in ``skipped`` by reason
        (``null_text``, ``invalid_utf8``, ``lone_surrogate``, ``empty_text``, ``non_finite_embedding``); every text
        skipped: ``NoInputError``, exit 66."""
        from petal.pipeline.ingest.text_rule import describe_skips
        from petal.pipeline.reliability.errors import NoInputError

        if not isinstance(query, (bool, np.bool_)):
            raise ArgumentTypeError(f"query={query!r} is {kind_of(query)}, not True or False")
        engine = self.engine  # NOTE: a closed Embedder refuses before any text is judged
        items = text_items(texts, "texts")
        # NOTE: the rule of petal index: null, undecodable and invisible texts are skipped and counted; rows keep
        # input positions (NaN rows, zeros for codes)
        skipped = skipped_texts(items)
        if items and len(skipped) == len(items):
            raise NoInputError(f"nothing to embed: {describe_skips(skipped)}")
        kept = [i for i in range(len(items)) if i not in skipped]
        texts_in = [t.decode("utf-8") if isinstance(t, bytes) else t for t in (items[i] for i in kept)]
        budget = engine.config.token_budget
        if batch_tokens is not None:
            batch_tokens = whole_number(batch_tokens, "batch_tokens")
        if batch_tokens is not None and not self.max_length <= batch_tokens <= budget:
            raise UsageError(f"batch_tokens {batch_tokens} is outside {self.max_length} (the max length) .. {budget} "
                             "(the engine's token budget: pass token_budget= to Embedder for more)")
        encoded, unseen = seen_texts(self._tokenizer("query" if query else "document"), texts_in)
        if unseen:  # NOTE: petal index's empty_text: characters the tokenizer drops, every one (combining marks)
            skipped = dict(sorted({**skipped, **{kept[i]: "empty_text" for i in unseen}}.items()))
            if len(skipped) == len(items):
                raise NoInputError(f"nothing to embed: {describe_skips(skipped)}")
        dropped = set(unseen)
        seen = [i for i in range(len(texts_in)) if i not in dropped]
        kept = [kept[i] for i in seen]
        vectors = embed_token_ids(engine, [encoded.token_ids[i] for i in seen], batch_tokens)
        truncated = int(encoded.truncated[seen].sum())
        over_chars = int(encoded.cut_at_chars()[seen].sum())
        finite = np.isfinite(vectors).all(axis=1)
        if not finite.all():
            # NOTE: the rule of petal index (non_finite_embedding): a text the model turns into NaN or infinity (an
            # overflow inside it) is skipped in its place, never written as a vector nor quantized into codes
            skipped = dict(sorted({**skipped, **{kept[i]: "non_finite_embedding"
                                                 for i in np.flatnonzero(~finite)}}.items()))
            if len(skipped) == len(items):
                raise NoInputError(f"nothing to embed: {describe_skips(skipped)}")
            kept = [i for i, ok in zip(kept, finite) if ok]
            vectors = vectors[finite]
        transform, learned = self.transform, False
        if not items and transform.int8_scheme == "calibrated" and transform.calibration is None:
            # NOTE: no texts, no rows, as in every other output format (no ranges to learn from nothing: was a
            # UsageError "calibrating int8 ranges needs at least 2 vectors, got 0")
            return Embedded(np.zeros((0, transform.dim), dtype=np.int8), 0, transform, False)
        if transform.int8_scheme == "calibrated" and transform.calibration is None:
            transform, learned = build(transform.calibrate, transform.stored(vectors)), True
        return Embedded(_placed(transform.output(vectors), len(items), kept), truncated, transform, learned, skipped,
                        over_chars=over_chars)

    def embed_stream(self, chunks: Iterable[tuple[Sequence[Any], bool]], *, query: bool = False) -> Iterator[Embedded]:
        """``embed`` over texts that arrive in chunks (``petal embed --stdin``): each answer (an ``Embedded`` whose
        ``start`` is the input position of its first row, ``skipped`` keyed by input position) follows the last, in
        input order, as soon as its texts are embedded.

        ``chunks``: ``(texts, more)`` pairs; ``more`` says that further texts are ready at once, so the texts of the
        last packed batch wait for them. Texts are packed exactly as one ``embed`` call over all of them packs them
        (first come first served: each batch closes where the next text does not fit), so the rows are the same;
        only a batch closed early because nothing more had arrived yet differs from it. Texts are skipped by
        ``embed``'s rule; no answer raises ``NoInputError`` (a chunk of blank lines is answered with skips). int8
        ranges learned from the texts need all of them at once: ``UsageError`` (use ``embed``)."""
        engine, transform = self.engine, self.transform
        if transform.int8_scheme == "calibrated" and transform.calibration is None:
            raise UsageError("int8 ranges learned from the texts embedded need every text at once: call embed(), "
                             "or pass calibration=INDEX")
        if not isinstance(query, (bool, np.bool_)):
            raise ArgumentTypeError(f"query={query!r} is {kind_of(query)}, not True or False")
        tokenizer = self._tokenizer("query" if query else "document")
        config = PackConfig(engine.config.token_budget, engine.config.max_seqs)
        start, held = 0, 0  # input position of the first text not answered yet, and how many texts are held
        skipped: dict[int, str] = {}
        # held texts to embed: (input position, token ids, truncated, cut at the characters petal reads)
        kept: list[tuple[int, np.ndarray, bool, bool]] = []
        if not isinstance(chunks, Iterable):
            raise ArgumentTypeError(f"embed_stream(): chunks {kind_of(chunks)} is not an iterable of (texts, more) "
                                    "pairs")
        for texts, more in _with_last(_chunk(chunk, number) for number, chunk in enumerate(chunks)):
            base = start + held
            fresh = [(base + i, text) for i, text in enumerate(texts)]
            skipped.update(skipped_texts(texts, base))
            to_embed = [(place, text.decode("utf-8") if isinstance(text, bytes) else text)
                        for place, text in fresh if place not in skipped]
            held += len(fresh)
            if to_embed:
                encoded, unseen = seen_texts(tokenizer, [text for _, text in to_embed])
                skipped.update((to_embed[i][0], "empty_text") for i in unseen)  # as embed()
                dropped = set(unseen)
                kept += [(place, ids, flag, long) for i, ((place, _), ids, flag, long)
                         in enumerate(zip(to_embed, encoded.token_ids, encoded.truncated.tolist(),
                                          encoded.cut_at_chars().tolist())) if i not in dropped]
            # NOTE: while more texts are ready, the last batch planned may grow with them: it waits, so every batch
            # is the one a single embed() over the whole input packs (its rows are the same to the last bit)
            batches = plan_batches([len(ids) for _, ids, _, _ in kept], config) if more and kept else []
            cut = batches[-1].start if batches else len(kept)
            end = kept[cut][0] if cut < len(kept) else start + held
            if end == start:
                continue
            now, kept = kept[:cut], kept[cut:]
            vectors = embed_token_ids(engine, [ids for _, ids, _, _ in now])
            finite = np.isfinite(vectors).all(axis=1)
            skipped.update((place, "non_finite_embedding") for (place, _, _, _), ok in zip(now, finite) if not ok)
            rows = _placed(transform.output(vectors[finite]), end - start,
                           [place - start for (place, _, _, _), ok in zip(now, finite) if ok])
            answered = {place: skipped.pop(place) for place in sorted(skipped) if place < end}
            yield Embedded(rows, sum(flag for _, _, flag, _ in now), transform, False, answered, start,
                           over_chars=sum(long for _, _, _, long in now))
            held -= end - start
            start = end

    def _tokenizer(self, side: str) -> TextTokenizer:
        if side not in self._tokenizers:
            # NOTE: a tokenizer.json petal cannot use (unreadable, ids past the model's table): ConfigError there
            self._tokenizers[side] = tokenizer_for(self.spec, "query" if side == "query" else "document")
        return self._tokenizers[side]


def skipped_texts(texts: Sequence[Any], start: int = 0) -> dict[int, str]:
    """The texts skipped before any model sees them (petal index's rule: null, not UTF-8, nothing visible), by input
    position (the first at ``start``), with the reason. ``petal embed`` judges its input by it before the model
    loads: an input that holds no text to embed is no input (66) whatever the model."""
    return {start + i: why for i, text in enumerate(texts)
            if (why := undecodable_text_reason(text) or skip_reason(text))}


def _chunk(chunk: Any, number: int) -> tuple[Sequence[Any], bool]:
    """One of ``embed_stream``'s ``(texts, more)`` pairs, its texts judged as ``embed`` judges its own
    (``text_items``: one str or bytes is one text). NOTE: iterated as it came, a str gave one text per character
    (``("a text", False)``: six rows, no word) and an int item was skipped as ``not_text`` where ``embed`` refuses it;
    a chunk that is no pair, or a ``more`` that is no bool, was a ValueError from unpacking or went unseen. Each is a
    ``TypeError`` (also a ``UsageError``) naming the chunk."""
    where = f"embed_stream(): chunks[{number}]"
    if not isinstance(chunk, (tuple, list)) or len(chunk) != 2:
        raise ArgumentTypeError(f"{where} is {kind_of(chunk)}, not a (texts, more) pair")
    texts, more = chunk
    if not isinstance(more, (bool, np.bool_)):
        raise ArgumentTypeError(f"{where}: more={more!r} is {kind_of(more)}, not True or False")
    return text_items(texts, f"{where}: texts"), bool(more)


def _with_last(chunks: Iterable[tuple[Sequence[Any], bool]]) -> Iterator[tuple[Sequence[Any], bool]]:
    """``chunks``, then an empty one that says nothing more is coming (what is held is answered)."""
    yield from chunks
    yield [], False


def _placed(embedded: np.ndarray, count: int, kept: list[int]) -> np.ndarray:
    """``count`` rows with ``embedded``'s rows at the positions ``kept`` and NaN (zeros for codes) at the others."""
    if len(kept) == count:
        return embedded
    rows = np.full((count, *embedded.shape[1:]), np.nan if embedded.dtype.kind == "f" else 0, embedded.dtype)
    rows[kept] = embedded
    return rows


def index_calibration(spec: ModelSpec, transform: OutputTransform, index_path: Path) -> OutputTransform:
    """The int8 ranges of an index built with this model and output settings (``--calibration INDEX``): the model
    matched with the index's as ``petal query`` matches it (``model_mismatch``: weights, tokenizer, pooling, ...),
    and the document prompt the index's vectors were embedded with, else ``UsageError`` (2) naming what differs.
    NOTE: the output settings alone were compared: another model's ranges (other weights, pooling) were taken,
    silently, and every code made with them was off."""
    from petal.pipeline.layout import resolve_index_dir
    from petal.pipeline.manifest import ModelRecord, model_mismatch

    _, manifest = resolve_index_dir(index_path)
    recorded = manifest.output
    if recorded is not None and recorded.calibration is not None:
        mismatch = model_mismatch(manifest, spec)
        model = manifest.model
        if isinstance(model, ModelRecord) and model.document_prompt != spec.prompts.document:
            # NOTE: the ranges are of its documents' vectors, embedded with this prompt (a query's is free, as in
            # petal query: it is not what the ranges were learned from)
            mismatch = ", ".join(filter(None, [mismatch, f"prompts.document: index {model.document_prompt!r}, "
                                                         f"model {spec.prompts.document!r}"]))
        if mismatch:
            raise UsageError(f"--calibration {index_path}: model {spec.path} does not match the index ({mismatch}); "
                             "its int8 ranges are of vectors this model does not make: give an index built with this "
                             "model and its settings, or leave --calibration out to learn the ranges from the texts "
                             "embedded")
    if recorded is None or recorded.calibration is None or \
            replace(recorded, calibration=None) != replace(transform, calibration=None):
        if recorded is None:
            had = "plain float vectors"
        elif recorded.quantize == "none":
            had = f"{recorded.output_dtype} vectors of dim {recorded.dim}"
        else:
            scheme = f", {recorded.int8_scheme} ranges" if recorded.int8_scheme else ""
            had = f"{recorded.quantize} codes of dim {recorded.dim}{scheme}"
        raise UsageError(f"--calibration {index_path}: that index holds no int8 ranges for this model and "
                         f"--dim (it holds {had})")
    return recorded


