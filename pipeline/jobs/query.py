"""The online query path: a published index plus the same model, pooling and normalisation it was
built with, kept warm to embed short queries and search."""

from __future__ import annotations

from pathlib import Path

from petal.engine.config import EngineConfig, ModelOptions
from petal.engine.engine import Engine, resolve_device, resolve_dtype
from petal.engine.loader import ModelError, ModelSpec, inspect_model
from petal.pipeline.index.search import Hit, IndexReader
from petal.pipeline.ingest.tokens import tokenizer_for
from petal.pipeline.jobs.embed import encode_texts
from petal.pipeline.reliability.errors import ConfigError
from petal.pipeline.store.outputs import OutputTransform

# What a query's model must share with the index's (keys of ModelSpec.describe(); checked when recorded).
MATCHING_KEYS = ("weights_sha256", "tokenizer_sha256", "pooling", "normalize", "dim", "attention", "dense",
                 "similarity", "int8_scheme", "eos_token_id")

QUERY_TOKEN_BUDGET = 2048


def model_for_index(manifest: dict, model: str | None, allow_pickle_weights: bool = False,
                    query_prompt: str | None = None) -> ModelSpec:
    """The model an index was built with (or ``model``, which must be the same weights), with the
    pooling, attention and query prompt recorded at index time (``query_prompt`` overrides the last)."""
    recorded = manifest["model"]
    path = model or recorded["path"]
    options = ModelOptions(pooling=recorded.get("pooling"), attention_mask=recorded.get("attention"),
                           query_prompt=query_prompt if query_prompt is not None
                           else recorded.get("prompts", {}).get("query"),
                           allow_pickle_weights=allow_pickle_weights)
    try:
        spec = inspect_model(path, options, max_length=manifest["max_length"])
    except ModelError as exc:
        hint = "" if model else " (the index's model is gone from where it was built; pass --model DIR)"
        raise ConfigError(f"{exc}{hint}") from exc
    described = spec.describe()
    differ = [k for k in MATCHING_KEYS if k in recorded and described[k] != recorded[k]]
    if differ:
        details = ", ".join(f"{k}: index {recorded.get(k)!r}, model {described[k]!r}" for k in differ)
        raise ConfigError(f"model {spec.path} does not match the index ({details})")
    return spec


class QueryService:
    """Embeds queries exactly as the index's documents were embedded, then searches."""

    def __init__(self, index_path: Path, model: str | None = None, device: str = "auto", dtype: str = "auto",
                 attention: str = "auto", nprobe: int | None = None, rescore: int | None = None,
                 query_prompt: str | None = None, allow_pickle_weights: bool = False) -> None:
        self.reader = IndexReader(index_path, nprobe=nprobe, rescore=rescore)
        self.spec = model_for_index(self.reader.manifest, model, allow_pickle_weights, query_prompt)
        # the index-time output transform (Matryoshka dim, int8 scheme, normalisation), applied to every query
        self.transform = OutputTransform.from_manifest(self.reader.manifest, self.spec)
        if self.transform.model_dim != self.spec.dim or self.transform.dim != self.reader.dim:
            raise ConfigError(f"model dim {self.spec.dim} -> {self.transform.dim} does not fit the index "
                              f"(dim {self.reader.dim}, built from {self.transform.model_dim}-dim vectors)")
        dev = resolve_device(device)
        config = EngineConfig(device=dev, dtype=resolve_dtype(dtype, dev), attention=attention,  # type: ignore[arg-type]
                              token_budget=max(QUERY_TOKEN_BUDGET, self.spec.pooling.max_length), max_seqs=64)
        self.engine = Engine(self.spec, config)
        self.tokenizer = tokenizer_for(self.spec, "query")  # the query prompt, EOS for last-token pooling

    @property
    def text_column(self) -> str:
        return str(self.reader.manifest.get("read", {}).get("text_column", "text"))

    def search(self, texts: list[str], k: int) -> list[list[Hit]]:
        vectors, _ = encode_texts(self.engine, self.tokenizer, texts)
        return self.reader.search(self.transform.stored(vectors), k)
