"""The online query path: a published index plus the same model, pooling and normalisation it was
built with, kept warm to embed short queries and search."""

from __future__ import annotations

from pathlib import Path

from engine.config import EngineConfig
from engine.engine import Engine, resolve_device, resolve_dtype
from engine.loader import ModelError, ModelSpec, inspect_model
from pipeline.encode import encode_texts
from pipeline.errors import ConfigError
from pipeline.searcher import Hit, IndexReader
from pipeline.tokens import TextTokenizer

QUERY_TOKEN_BUDGET = 2048


def model_for_index(manifest: dict, model: str | None) -> ModelSpec:
    """The model an index was built with (or ``model``, which must be the same weights)."""
    recorded = manifest["model"]
    path = model or recorded["path"]
    try:
        spec = inspect_model(path, max_length=manifest["max_length"])
    except ModelError as exc:
        hint = "" if model else " (the index's model is gone from where it was built; pass --model DIR)"
        raise ConfigError(f"{exc}{hint}") from exc
    described = spec.describe()
    differ = [k for k in ("weights_sha256", "tokenizer_sha256", "pooling", "normalize", "dim")
              if described[k] != recorded.get(k)]
    if differ:
        details = ", ".join(f"{k}: index {recorded.get(k)!r}, model {described[k]!r}" for k in differ)
        raise ConfigError(f"model {spec.path} does not match the index ({details})")
    return spec


class QueryService:
    """Embeds queries exactly as the index's documents were embedded, then searches."""

    def __init__(self, index_path: Path, model: str | None = None, device: str = "auto", dtype: str = "auto",
                 attention: str = "auto", nprobe: int | None = None) -> None:
        self.reader = IndexReader(index_path, nprobe=nprobe)
        self.spec = model_for_index(self.reader.manifest, model)
        if self.spec.dim != self.reader.dim:
            raise ConfigError(f"model dim {self.spec.dim} != index dim {self.reader.dim}")
        dev = resolve_device(device)
        config = EngineConfig(device=dev, dtype=resolve_dtype(dtype, dev), attention=attention,  # type: ignore[arg-type]
                              token_budget=max(QUERY_TOKEN_BUDGET, self.spec.pooling.max_length), max_seqs=64)
        self.engine = Engine(self.spec, config)
        self.tokenizer = TextTokenizer(self.spec.tokenizer_file, self.spec.pooling.max_length)

    @property
    def text_column(self) -> str:
        return str(self.reader.manifest.get("read", {}).get("text_column", "text"))

    def search(self, texts: list[str], k: int) -> list[list[Hit]]:
        vectors, _ = encode_texts(self.engine, self.tokenizer, texts)
        return self.reader.search(vectors, k)
