"""Frozen configuration of an indexing run, validated once when built from the CLI's flags."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

METRICS = ("ip", "l2")
DEFAULT_ID_COLUMN = "id"
DEFAULT_TEXT_COLUMN = "text"


@dataclass(frozen=True)
class ReadConfig:
    """Which columns to read and how much at a time."""

    text_column: str = DEFAULT_TEXT_COLUMN
    id_column: str = DEFAULT_ID_COLUMN
    id_column_required: bool = False  # True when the user named it: absent is then an error
    batch_rows: int = 4096  # rows per Arrow record batch read

    def __post_init__(self) -> None:
        if not self.text_column or not self.id_column:
            raise ValueError("--text-column and --id-column must not be empty")
        if self.text_column == self.id_column:
            raise ValueError(f"--text-column and --id-column are both {self.text_column!r}")
        if self.batch_rows < 1:
            raise ValueError(f"batch_rows {self.batch_rows} < 1")


SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """``"4G"`` -> 4 * 2**30 bytes (units B, K, M, G, T; binary; an optional trailing ``iB``/``B``)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if match is None:
        raise ValueError(f"size {text!r} is not a number with an optional unit (K, M, G, T), e.g. 4G or 512M")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2)])


@dataclass(frozen=True)
class IndexSettings:
    """How vectors become a FAISS index (``pipeline/index_factory.py`` reads these)."""

    factory: str = "auto"  # "auto" or a FAISS index factory string
    metric: str = "ip"
    seed: int = 1234
    flat_max_vectors: int = 50_000  # "auto": exact search up to this many vectors (when it fits the budget)
    memory_bytes: int = 8 << 30  # --index-memory: what the index may hold in RAM; IVF above it goes on disk
    target_recall: float = 0.95  # --target-recall: recall@10 against exact search, reached by tuning
    train_points_per_centroid: int = 64  # k-means sample size per IVF list (FAISS: 30..256)
    tune_queries: int = 1000  # held-out vectors the search parameters are tuned on

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"--metric {self.metric!r} is not one of {', '.join(METRICS)}")
        if not self.factory:
            raise ValueError("--index-factory must not be empty")
        if self.memory_bytes < 1 << 20:
            raise ValueError(f"--index-memory {self.memory_bytes} bytes < 1M: give at least 1M")
        if not 0.0 < self.target_recall <= 1.0:
            raise ValueError(f"--target-recall {self.target_recall} is not in (0, 1]")
        if not 30 <= self.train_points_per_centroid <= 256:
            raise ValueError(f"train_points_per_centroid {self.train_points_per_centroid} is not in 30..256")
        if self.tune_queries < 10:
            raise ValueError(f"tune_queries {self.tune_queries} < 10")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class IndexJob:
    """Everything ``petal index`` was asked to do."""

    sources: tuple[str, ...]
    out: Path
    model: str | None  # None: the packaged default
    read: ReadConfig
    index: IndexSettings
    device: str = "auto"
    dtype: str = "auto"
    attention: str = "auto"
    cuda_graphs: bool = True
    max_length: int | None = None
    token_budget: int | None = None  # None: chosen for the device
    max_seqs: int = 256
    full: bool = False  # ignore the store and the live version's settings: re-embed everything
    strict: bool = False
    quiet: bool = False
    json_report: Path | None = None

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("no SOURCE given")
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"--max-length {self.max_length} < 2")
        if self.token_budget is not None and self.token_budget < 2:
            raise ValueError(f"--token-budget {self.token_budget} < 2")
        if self.max_seqs < 1:
            raise ValueError(f"--max-seqs {self.max_seqs} < 1")


def default_token_budget(device: str, max_length: int) -> int:
    """Tokens per step: enough to saturate the device, never below one full-length sequence."""
    budget = 16384 if device == "cuda" else 4096
    return max(budget, max_length)
