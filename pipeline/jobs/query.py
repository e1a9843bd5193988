"""The query path, shared by ``petal query`` and ``petal serve``: a published index plus the same
model, pooling, prompt and output transform it was built with, kept warm to embed short queries
and search.

```
QueryModel   model_for_index() -> Engine + query/document tokenizers      tokenize(), embed()
SearchIndex  IndexReader + the index-time OutputTransform + version id    search(model vectors, k)
QueryService QueryModel + SearchIndex: search(texts, k)                   (petal query, --stdin)
```

``petal serve`` tokenizes with ``QueryModel.tokenize``, batches the token ids of many requests
through the same ``Engine.step`` and searches through ``SearchIndex.search``: one implementation.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np

from petal.engine.config import AttentionMaskName, EngineConfig, ModelOptions, Source, pooling_mode
from petal.engine.errors import ModelError
from petal.engine.loader import MaxLengthError, ModelSpec, inspect_model
from petal.pipeline.index.search import Hit, IndexReader
from petal.pipeline.ingest.text_rule import skip_reason
from petal.pipeline.ingest.tokens import Encoded, TextTokenizer, room_sources, tokenizer_for
from petal.pipeline.jobs.embed import embed_token_ids, encode_texts, seen_texts
from petal.pipeline.layout import resolve_index_dir
from petal.pipeline.manifest import Manifest, ModelRecord, model_mismatch
from petal.pipeline.reliability.errors import (
    BadInputError,
    ConfigError,
    FlagError,
    UsageError,
    flag_errors,
    quote_text,
)
from petal.pipeline.store.outputs import OutputTransform

if TYPE_CHECKING:
    from petal.engine.engine import Engine

QUERY_TOKEN_BUDGET = 2048
Side = Literal["query", "document"]
MAX_TOKENS_FLAG = Source("--max-tokens-per-text", flag=True)
# NOTE: at query time the max length and (without --query-prompt) the query prompt are the index's, recorded when it
# was built: no flag of the command changes them, so a prompt that leaves no room beside them is the index's (78)
INDEX_LENGTH = Source("the index's max length (manifest.json max_length)")
INDEX_PROMPT = Source("the index's query prompt (manifest.json model.query_prompt)")


def model_for_index(manifest: Manifest, model: str | None, allow_pickle_weights: bool = False,
                    query_prompt: str | None = None) -> ModelSpec:
    """The model an index was built with (or ``model``, which must be the same weights), with the
    pooling, attention and query prompt recorded at index time (``query_prompt`` overrides the last).

    The packaged default model is found by name in this environment; another model at its recorded
    path, or at ``model`` when it moved (its weights' sha256 must match).
    """
    recorded = manifest.model
    if not isinstance(recorded, ModelRecord):  # --vectors-column: no model to embed a text query with
        raise UsageError("the index was built from precomputed vectors (--vectors-column): query it by vectors "
                         "(petal query --vector-file Q.npy)")
    options = _recorded_options(recorded, allow_pickle_weights, query_prompt)
    try:
        spec = _inspected(model, recorded, options, manifest.max_length, query_prompt is not None)
    except MaxLengthError:
        # NOTE: the index embeds more tokens than this model has positions for: it is not the index's model (the
        # run that built the index took that length). Said as the mismatch it is, never as a --max-length the user
        # never gave
        spec = _inspected(model, recorded, options, None, query_prompt is not None)
        mismatch = ", ".join(filter(None, [model_mismatch(manifest, spec), f"max_length: index {manifest.max_length}, "
                                           f"model {spec.model_max_length}"]))
        raise ConfigError(f"model {spec.path} does not match the index ({mismatch})") from None
    mismatch = model_mismatch(manifest, spec)
    if mismatch:
        raise ConfigError(f"model {spec.path} does not match the index ({mismatch})")
    return spec


def _recorded_options(recorded: ModelRecord, allow_pickle_weights: bool, query_prompt: str | None) -> ModelOptions:
    """The options an index's model is inspected with: its pooling, attention and query prompt as recorded at index
    time (``query_prompt`` overrides the last)."""
    return ModelOptions(pooling=pooling_mode(recorded.pooling),
                        attention_mask=cast("AttentionMaskName | None", recorded.attention),
                        query_prompt=query_prompt if query_prompt is not None else recorded.query_prompt,
                        allow_pickle_weights=allow_pickle_weights)


def query_tokenizers(spec: ModelSpec, max_tokens: int | None = None) -> dict[str, TextTokenizer]:
    """The tokenizers of a warm model, by side: the query prompt (EOS for last-token pooling), the document side as
    ``petal index`` embeds; cut at ``max_tokens`` where that is under the model's max length (``petal serve
    --max-tokens-per-text``). ``FlagError`` (2) naming the flag where a prompt leaves no room for text."""
    tokenizers = {"query": tokenizer_for(spec, "query"), "document": tokenizer_for(spec, "document")}
    if max_tokens is not None and max_tokens < spec.pooling.max_length:
        tokenizers = {side: TextTokenizer(spec.tokenizer_file, max_tokens, prompt=t.prompt,
                                          eos_token_id=spec.eos_token_id, vocab_size=spec.config.vocab_size,
                                          sources=room_sources(spec, cast(Side, side), length=MAX_TOKENS_FLAG))
                      for side, t in tokenizers.items()}
    return tokenizers


def check_query_model(manifest: Manifest, model: str | None, allow_pickle_weights: bool = False,
                      query_prompt: str | None = None, max_tokens: int | None = None,
                      token_budget: int | None = None) -> None:
    """What ``model_for_index`` would refuse that is cheap to find: ``model`` (or the index's own) not a usable
    model directory (``ConfigError``, 78), ``query_prompt`` leaving no room for text at the index's max length or at
    ``max_tokens``, a ``token_budget`` under the model's max length (``FlagError``, 2). Not the weights' sha256 (read in
    full) nor the match with the index, which ``model_for_index`` judges."""
    recorded = manifest.model
    if not isinstance(recorded, ModelRecord):
        return
    options = _recorded_options(recorded, allow_pickle_weights, query_prompt)
    try:
        spec = _inspected(model, recorded, options, manifest.max_length, query_prompt is not None)
    except MaxLengthError:  # NOTE: not the index's model: model_for_index says so, as a mismatch
        return
    if query_prompt is not None or max_tokens is not None:
        query_tokenizers(spec, max_tokens)  # NOTE: their room checks (TextTokenizer)
    check_token_budget(spec, token_budget)


def _inspected(model: str | None, recorded: ModelRecord, options: ModelOptions, max_length: int | None,
               query_prompt_given: bool) -> ModelSpec:
    """``model`` (else the index's, ``recorded``) inspected; its ``ModelError`` a ``ConfigError`` (78), except a
    ``MaxLengthError`` (``max_length`` past the model's positions), which the caller judges."""
    try:
        spec = inspect_model(model or recorded.locator, options, max_length=max_length)
    except MaxLengthError:
        raise
    except ModelError as exc:
        hint = "" if model or recorded.locator is None else \
            " (the index's model is gone from where it was built; pass --model DIR)"
        raise ConfigError(f"{exc}{hint}") from exc
    return _index_sources(spec, recorded, max_length, query_prompt_given)


def _index_sources(spec: ModelSpec, recorded: ModelRecord, max_length: int | None,
                   query_prompt_given: bool) -> ModelSpec:
    """``spec`` with the sources of what the index recorded: its max length and, unless --query-prompt gave one
    (``query_prompt_given``), its query prompt (``INDEX_LENGTH``, ``INDEX_PROMPT``)."""
    sources = spec.sources
    if max_length is not None:
        sources = replace(sources, max_length=INDEX_LENGTH)
    if recorded.query_prompt is not None and not query_prompt_given:
        sources = replace(sources, query_prompt=INDEX_PROMPT)
    return replace(spec, sources=sources)


def precomputed_message(manifest: Manifest) -> str:
    """Why a text query on an index of precomputed vectors is refused (the caller says what to send instead)."""
    recorded = manifest.model
    column = f" {recorded.vectors_column}" if not isinstance(recorded, ModelRecord) else ""
    return (f"{manifest.version} was built from precomputed vectors (--vectors-column{column}, dim "
            f"{manifest.dim}), without a model to embed a text query with")


def engine_config(spec: ModelSpec, device: str = "auto", dtype: str = "auto", attention: str = "auto",
                  token_budget: int | None = None, max_seqs: int = 64,
                  default_budget: int = QUERY_TOKEN_BUDGET) -> EngineConfig:
    """The engine settings of a query process: ``token_budget`` as given (``FlagError``, 2, where it is under the
    model's max length: ``check_token_budget``); not given, ``default_budget``, raised to that where it is under."""
    from petal.engine.engine import attention_backend, resolve_device, resolve_dtype  # NOTE: torch, with a model

    check_token_budget(spec, token_budget)
    dev = resolve_device(device)
    budget = token_budget or max(default_budget, spec.pooling.max_length)
    return EngineConfig(device=dev, dtype=resolve_dtype(dtype, dev), attention=attention_backend(attention),
                        token_budget=budget, max_seqs=max_seqs)


def check_token_budget(spec: ModelSpec, token_budget: int | None) -> None:
    """``FlagError`` (2) naming ``--token-budget`` where it is under the model's max length (an engine step holds at
    least one whole text: ``Engine`` refuses less).
    NOTE: before, such a budget was raised to the max length without a word (``petal serve --token-budget 128`` ran
    steps of up to 256 tokens with MiniLM, and ``--max-wait-ms`` waited for 256)."""
    need = spec.pooling.max_length
    if token_budget is not None and token_budget < need:
        raise FlagError(f"--token-budget {token_budget} is under the model's max length ({need} tokens): an engine "
                        f"step holds at least one whole text; give --token-budget {need} or more")


class QueryModel:
    """A warm model: tokenizers for both prompt sides and the engine (one thread drives it)."""

    def __init__(self, spec: ModelSpec, config: EngineConfig, max_tokens: int | None = None) -> None:
        from petal.engine.engine import Engine  # NOTE: torch: only where a model runs (petal serve of vectors: none)

        self.spec = spec
        self.tokenizers = query_tokenizers(spec, max_tokens)  # NOTE: before the engine: their room checks are cheap
        self.engine = Engine(spec, config)
        self.max_tokens = min(max_tokens or spec.pooling.max_length, spec.pooling.max_length)
        self.num_truncated = 0  # texts ``embed`` cut at ``max_tokens`` (petal query says how many)
        # of them, those ``embed_seen`` cut at the characters petal reads (``TextTokenizer.max_text_chars``)
        self.num_over_chars = 0

    @property
    def dim(self) -> int:
        return self.spec.dim

    def tokenize(self, texts: list[str], side: Side = "query") -> Encoded:
        """Token ids as the engine takes them (prompt, truncation at the model's max length, EOS)."""
        return self.tokenizers[side].encode(texts)

    def embed(self, texts: list[str], side: Side = "query") -> np.ndarray:
        """``[len(texts), model_dim]`` float32 model vectors, in order, every text embedded (one caller thread at a
        time); ``embed_seen`` leaves out those the model sees as empty."""
        vectors, truncated = encode_texts(self.engine, self.tokenizers[side], texts)
        self.num_truncated += truncated
        return vectors

    def embed_seen(self, texts: list[str], side: Side = "query") -> tuple[np.ndarray, list[int]]:
        """The float32 model vectors of the texts the model sees, ``[len(texts) - len(unseen), model_dim]`` in order,
        and ``unseen``: the places of those it sees as empty, not embedded (every character dropped by its tokenizer,
        such as combining marks or U+FFFD under MiniLM, or no token at all: ``seen_texts``, which ``petal index``
        skips as ``empty_text``; embedded, each would be the one vector of an empty text). One caller thread at a
        time."""
        encoded, unseen = seen_texts(self.tokenizers[side], texts)
        dropped = set(unseen)
        seen = [i for i in range(len(texts)) if i not in dropped]
        self.num_truncated += int(encoded.truncated[seen].sum())
        self.num_over_chars += int(encoded.cut_at_chars()[seen].sum())
        return embed_token_ids(self.engine, [encoded.token_ids[i] for i in seen]), unseen

    def unseen(self, texts: list[str], side: Side = "query") -> list[int]:
        """The places of ``texts`` the model sees as empty (see ``embed_seen``), without embedding any."""
        return seen_texts(self.tokenizers[side], texts)[1]


@dataclass(frozen=True)
class SearchIndex:
    """One published version, opened for search, with the transform its vectors went through."""

    reader: IndexReader
    transform: OutputTransform

    @classmethod
    def open(cls, path: Path, spec: ModelSpec, nprobe: int | None = None, rescore: int | None = None) -> SearchIndex:
        """Open ``path`` (OUT, following CURRENT, or a version directory), checked against ``spec``."""
        return cls.from_reader(IndexReader(path, nprobe=nprobe, rescore=rescore), spec)

    @classmethod
    def from_reader(cls, reader: IndexReader, spec: ModelSpec | None) -> SearchIndex:
        """``reader`` searched with ``spec``'s query vectors, or (``spec`` None) an index of precomputed vectors
        (``--vectors-column``), searched by vectors in its space only (``search_stored``)."""
        manifest = reader.manifest
        if spec is None or manifest.precomputed:
            if not manifest.precomputed:
                raise ConfigError(f"{manifest.version} was built with a model ({manifest.model.display}): its "
                                  "queries are embedded with it")
            if spec is not None:
                raise ConfigError(f"{manifest.version} was built from precomputed vectors (--vectors-column): it has "
                                  "no model to embed queries with")
            # NOTE: the record of how the stored vectors were shaped (identity for --vectors-column): compared when a
            # new version replaces this one, never applied to a query
            transform = manifest.output or OutputTransform(model_dim=reader.dim, dim=reader.dim, renormalize=False,
                                                           cosine=False)
            return cls(reader, transform)
        transform = manifest.transform(spec)
        if transform.model_dim != spec.dim or transform.dim != reader.dim:
            raise ConfigError(f"model dim {spec.dim} -> {transform.dim} does not fit the index "
                              f"(dim {reader.dim}, built from {transform.model_dim}-dim vectors)")
        return cls(reader, transform)

    @property
    def version(self) -> str:
        return self.reader.manifest.version

    @property
    def text_column(self) -> str:
        return self.reader.manifest.columns.text_column

    @property
    def precomputed(self) -> bool:
        """Built from precomputed vectors (``--vectors-column``): searched by vectors only, no model."""
        return self.reader.manifest.precomputed

    def search(self, model_vectors: np.ndarray, k: int, where: str | None = None) -> list[list[Hit]]:
        """Top ``k`` hits per row of model vectors, after the index-time transform (``where``: a filter on kept
        columns, applied inside FAISS: ``pipeline/index/filters.py``)."""
        if self.precomputed:  # NOTE: no model made the stored vectors: a model's vectors are not in their space
            raise UsageError(precomputed_message(self.reader.manifest))
        return self.reader.search(self.transform.stored(model_vectors), k, where=where)

    def search_stored(self, vectors: np.ndarray, k: int, where: str | None = None) -> list[list[Hit]]:
        """Top ``k`` hits per row of vectors already in the index's space (``[n, dim]``)."""
        return self.reader.search(np.asarray(vectors, dtype=np.float32), k, where=where)


class NonFiniteQueryError(BadInputError):
    """A query text whose model vector holds NaN or infinity (``row``: its place among the texts searched)."""

    def __init__(self, row: int, text: str) -> None:
        super().__init__(f"query {row} ({quote_text(text)}) embeds to NaN or infinite values with this model (an "
                         "overflow inside the model): it cannot be searched (non_finite_embedding)")
        self.row, self.text = row, text


class QueryService:
    """Embeds queries exactly as the index's documents were embedded, then searches."""

    def __init__(self, index_path: Path, model: str | None = None, device: str = "auto", dtype: str = "auto",
                 attention: str = "auto", nprobe: int | None = None, rescore: int | None = None,
                 query_prompt: str | None = None, allow_pickle_weights: bool = False,
                 reader: IndexReader | None = None) -> None:
        # ``reader``: the index already open (``petal.open_index``), else ``index_path`` is opened here.
        # NOTE: opened here, the model is checked against the manifest before any index file is opened (a wrong
        # model is a configuration error whatever the files hold); the manifest's own checksum is checked on open.
        if reader is None:
            _, manifest = resolve_index_dir(index_path)
            self.spec = model_for_index(manifest, model, allow_pickle_weights, query_prompt)
            reader = IndexReader(index_path, nprobe=nprobe, rescore=rescore)
            if reader.manifest.model != manifest.model:  # a new version was published meanwhile
                self.spec = model_for_index(reader.manifest, model, allow_pickle_weights, query_prompt)
        else:
            self.spec = model_for_index(reader.manifest, model, allow_pickle_weights, query_prompt)
        self.index = SearchIndex.from_reader(reader, self.spec)
        with flag_errors():  # --device, --dtype, --attention this host cannot run
            self.model = QueryModel(self.spec, engine_config(self.spec, device, dtype, attention))

    @property
    def reader(self) -> IndexReader:
        return self.index.reader

    @property
    def transform(self) -> OutputTransform:
        return self.index.transform

    @property
    def engine(self) -> Engine:
        return self.model.engine

    @property
    def tokenizer(self) -> TextTokenizer:
        return self.model.tokenizers["query"]

    @property
    def text_column(self) -> str:
        return self.index.text_column

    def search(self, texts: list[str], k: int, where: str | None = None) -> list[list[Hit]]:
        """Top ``k`` hits per text. A text the model sees as empty (its tokenizer drops every character: ``unseen``)
        gets no hits, in its place, neither embedded nor searched, as a blank query: its vector would be an empty
        text's, the same for every such text, and its hits meaningless (``petal index`` and ``petal embed`` skip
        such a text as ``empty_text``). A text the model embeds to NaN or infinity is a ``NonFiniteQueryError``
        (65), before any search: FAISS would answer it with no hits or arbitrary ones (``petal index`` and ``petal
        embed`` skip such a text as ``non_finite_embedding``; a query cannot be answered without its vector)."""
        vectors, unseen = self.model.embed_seen(texts)
        dropped = set(unseen)
        seen = [i for i in range(len(texts)) if i not in dropped]
        finite = np.isfinite(vectors).all(axis=1)
        if not finite.all():
            row = seen[int(np.argmin(finite))]
            raise NonFiniteQueryError(row, texts[row])
        hits: list[list[Hit]] = [[] for _ in texts]
        if seen:
            for i, found in zip(seen, self.index.search(vectors, k, where=where)):
                hits[i] = found
        return hits

    def unseen(self, texts: Any) -> list[int]:
        """The places of ``texts`` that ``search`` answers with no hits because the model sees them as empty (its
        tokenizer drops every character: ``empty_text``; a ``None`` or blank one too), not for want of a match.

        ``texts`` as ``Index.search`` takes them (one str or UTF-8 bytes, or any iterable of them, ``None`` among
        them); anything else is a ``TypeError`` (also a ``UsageError``) naming ``texts``. NOTE: they went to the
        tokenizer as given: a bytes, ``None``, a lone surrogate or a numpy array raised a raw ``TypeError`` or
        ``ValueError`` from inside it, for texts ``search`` answers."""
        from petal.pipeline.jobs.searcher import query_texts

        items = query_texts(texts, "texts")
        asked = [i for i, text in enumerate(items) if skip_reason(text) is None]
        not_asked = set(range(len(items))) - set(asked)
        seen_empty = self.model.unseen([cast(str, items[i]) for i in asked])
        return sorted(not_asked | {asked[j] for j in seen_empty})

    def on(self, reader: IndexReader) -> QueryService | None:
        """This warm model searching ``reader``, another version of the index, when that version was built with the
        same model, settings and query prompt (``None`` otherwise: the caller loads the model that version needs)."""
        before, after = self.reader.manifest, reader.manifest
        if not isinstance(before.model, ModelRecord) or not isinstance(after.model, ModelRecord):
            return None
        # NOTE: weights_stat is when the weights were last hashed, not what they are
        if (replace(before.model, weights_stat=None) != replace(after.model, weights_stat=None)
                or before.max_length != after.max_length):
            return None
        service = copy.copy(self)
        service.index = SearchIndex.from_reader(reader, self.spec)
        return service
