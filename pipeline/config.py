"""Frozen configuration of an indexing run, validated once when built from the CLI's flags."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.config import ModelOptions
from pipeline.outputs import OutputConfig

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


@dataclass(frozen=True)
class IndexSettings:
    """How vectors become a FAISS index."""

    factory: str = "auto"  # "auto" or a FAISS index factory string
    metric: str = "ip"
    seed: int = 1234
    flat_max_vectors: int = 50_000  # "auto": exact search up to this many vectors, IVF above

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(f"--metric {self.metric!r} is not one of {', '.join(METRICS)}")
        if not self.factory:
            raise ValueError("--index-factory must not be empty")


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
    model_options: ModelOptions = field(default_factory=ModelOptions)  # issue 4: --pooling, --attention-mask, ...
    output: OutputConfig = field(default_factory=OutputConfig)  # issue 4: --dim, --quantize, --output-dtype

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
