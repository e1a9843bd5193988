"""Output formats: what the engine's vectors become before they are stored, indexed or written out.

```
model vector [model_dim] float32
  -> Matryoshka: the first ``dim`` values, renormalised when the model normalises   vectors()
  -> float16: rounded to half precision (--output-dtype float16)
  -> int8 codes: the model's own scheme where it has one (pplx-embed: round(127 tanh(x)), no
     normalisation), else calibrated per-dimension ranges learned from a corpus sample (the
     codec of FAISS's SQ8, so the index stores exactly these codes)                  codes()
  -> binary: sign bits (x >= 0) packed 8 to a byte, first value in the high bit     codes()
```

The store and the index hold ``stored()`` vectors: the float vectors (for the tanh scheme, its
int8 values), L2-normalised when the model compares by cosine. The engine returns model vectors;
``StoreSink`` (``pipeline/store/embeddings.py``) applies ``stored()`` where they enter the store. A
query goes through the same ``stored()`` before search, and the manifest records the transform
(``pipeline/manifest.py``), so every query sees exactly the index-time transform.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from petal.pipeline.read_only import read_only
from petal.pipeline.reliability.errors import FlagError

if TYPE_CHECKING:
    from petal.engine.loader import ModelSpec

QUANTIZE_MODES: tuple[str, ...] = ("none", "int8", "binary")
OUTPUT_DTYPES: tuple[str, ...] = ("float32", "float16")
INT8_SCHEMES: tuple[str, ...] = ("tanh", "calibrated")


@dataclass(frozen=True)
class OutputConfig:
    """What the user asked the vectors to become: ``--dim``, ``--quantize``, ``--output-dtype``."""

    dim: int | None = None  # None: the model's width
    quantize: str = "none"
    output_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dim is not None and self.dim < 1:
            raise ValueError(f"--dim {self.dim} < 1")
        if self.quantize not in QUANTIZE_MODES:
            raise ValueError(f"--quantize {self.quantize!r} is not one of {', '.join(QUANTIZE_MODES)}")
        if self.output_dtype not in OUTPUT_DTYPES:
            raise ValueError(f"--output-dtype {self.output_dtype!r} is not one of {', '.join(OUTPUT_DTYPES)}")
        if self.quantize != "none" and self.output_dtype != "float32":
            raise ValueError(f"--output-dtype {self.output_dtype} conflicts with --quantize {self.quantize}: "
                             "it sets the type of float vectors; drop one of the two")


@read_only
@dataclass(frozen=True)
class Calibration:
    """Per-dimension ranges of calibrated int8, as FAISS SQ8 keeps them (``vmin``, ``vdiff``):
    ``code = floor(255 clip((x - low) / span, 0, 1)) - 128``."""

    low: tuple[float, ...]
    span: tuple[float, ...]

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.low, dtype=np.float32), np.asarray(self.span, dtype=np.float32)


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero).

    NOTE: a row's norm is taken in float64 where float32's overflows or underflows (a finite row of values near 1e30,
    or 1e-25): it was inf (the row became all zeros: a search on it gave score 0 for every hit) or 0 (not unit
    length)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # (those rows taken again below)
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        unit = (x / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)
    # NOTE: every row the division's floor (1e-12) held back (was under 1e-18: a row of norm 1e-14 came out 0.2 long)
    odd = np.flatnonzero(~np.isfinite(norms[:, 0]) | (norms[:, 0] < 1e-12))
    if len(odd):  # NOTE: only those rows in float64 (a zero or NaN row made the whole batch's division float64)
        rows = x[odd].astype(np.float64)
        with np.errstate(invalid="ignore"):
            unit[odd] = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-300)
    return unit


FLOAT32_MAX = float(np.finfo(np.float32).max)  # 3.4e38


def squared_norm_overflows(rows: np.ndarray) -> np.ndarray:
    """``[n]`` bool: the rows of ``rows [n, dim]`` whose squared L2 norm float32 cannot hold (beyond 3.4e38: a norm
    beyond 1.8e19), taken in float64. FAISS works with squared norms in float32 (L2 distances, IVF training), so an
    L2 distance to such a row is infinite whatever the other vector; two rows within it have inner products within
    float32 (``|q . x| <= |q| |x| <= 3.4e38``). The one bound of a stored vector (``vector_too_large``) and of an
    L2 index's query."""
    return squared_norms(rows) > FLOAT32_MAX


def squared_norms(rows: np.ndarray) -> np.ndarray:
    """``[n]`` float64: the squared L2 norm of each of ``rows [n, dim]``, taken in float64."""
    return np.einsum("ij,ij->i", rows, rows, dtype=np.float64)


def tanh_int8(x: np.ndarray) -> np.ndarray:
    """pplx-embed's int8: ``clamp(round(127 tanh(x)), -128, 127)`` (half to even, as torch.round)."""
    return np.clip(np.rint(127.0 * np.tanh(x)), -128, 127).astype(np.int8)


@read_only
@dataclass(frozen=True)
class OutputTransform:
    """Model vectors -> stored vectors -> int8 codes or sign bits, as recorded in the manifest."""

    model_dim: int
    dim: int
    renormalize: bool  # the model normalises: truncated vectors are renormalised
    cosine: bool  # the model compares by cosine: stored vectors are L2-normalised
    quantize: str = "none"
    int8_scheme: str | None = None  # "tanh" (the model's own) or "calibrated", with quantize int8
    output_dtype: str = "float32"
    calibration: Calibration | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.dim <= self.model_dim:
            raise FlagError(f"--dim {self.dim} is outside the model's 1..{self.model_dim} dimensions")
        if self.quantize == "binary" and self.dim % 8:
            raise FlagError(f"--quantize binary packs 8 values a byte: --dim must be a multiple of 8, not {self.dim}")
        if (self.quantize == "int8") != (self.int8_scheme in INT8_SCHEMES):
            raise ValueError(f"int8 scheme {self.int8_scheme!r} does not fit --quantize {self.quantize}")

    @classmethod
    def for_model(cls, spec: ModelSpec, config: OutputConfig) -> OutputTransform:
        """The transform ``config`` asks of ``spec``'s vectors (int8 follows the model's own scheme if any)."""
        scheme = (spec.int8_scheme or "calibrated") if config.quantize == "int8" else None
        return cls(model_dim=spec.dim, dim=config.dim or spec.dim, renormalize=spec.pooling.normalize,
                   cosine=spec.similarity == "cosine", quantize=config.quantize, int8_scheme=scheme,
                   output_dtype=config.output_dtype)

    @property
    def is_identity(self) -> bool:
        """Stored vectors are the engine's vectors unchanged."""
        return (self.dim == self.model_dim and self.quantize == "none" and self.output_dtype == "float32"
                and (self.renormalize or not self.cosine))

    @property
    def normalized(self) -> bool:
        """Stored vectors have unit L2 norm."""
        return self.renormalize or self.cosine

    def vectors(self, x: np.ndarray) -> np.ndarray:
        """``[n, model_dim]`` -> ``[n, dim]`` float32: truncated, renormalised if the model normalises,
        rounded to float16 if asked (what ``petal embed`` writes for float output)."""
        out = np.ascontiguousarray(x[:, : self.dim], dtype=np.float32)
        if self.renormalize and self.dim < self.model_dim:
            out = l2_normalize(out)
        return self._round(out)

    def stored(self, x: np.ndarray) -> np.ndarray:
        """``[n, model_dim]`` -> ``[n, dim]`` float32: what the store and index hold, and what a query searches with."""
        out = np.ascontiguousarray(x[:, : self.dim], dtype=np.float32)
        if self.int8_scheme == "tanh":
            out = tanh_int8(out).astype(np.float32)
        if self.normalized:
            out = l2_normalize(out)
        return self._round(out)

    def codes(self, x: np.ndarray) -> np.ndarray:
        """``[n, model_dim]`` -> int8 ``[n, dim]`` (quantize int8) or packed sign bits uint8 ``[n, dim / 8]``."""
        if self.quantize == "binary":
            return np.packbits(x[:, : self.dim] >= 0, axis=1)
        if self.int8_scheme == "tanh":
            return tanh_int8(np.asarray(x[:, : self.dim], dtype=np.float32))
        if self.int8_scheme == "calibrated":
            if self.calibration is None:
                raise ValueError("calibrated int8 needs per-dimension ranges: calibrate() on a sample first")
            return calibrated_codes(self.stored(x), self.calibration)
        raise ValueError("codes() needs --quantize int8 or binary")

    def output(self, x: np.ndarray) -> np.ndarray:
        """What ``petal embed`` writes: float32/float16 vectors, int8 codes or packed bits."""
        if self.quantize != "none":
            return self.codes(x)
        return self.vectors(x).astype(self.output_dtype)

    def calibrate(self, stored: np.ndarray) -> OutputTransform:
        """Per-dimension min/max of a sample of stored vectors (FAISS SQ8's training rule)."""
        if len(stored) < 2:
            raise ValueError(f"calibrating int8 ranges needs at least 2 vectors, got {len(stored)} (embed more "
                             "texts at once, or take the ranges of an index built with this model: "
                             "--calibration INDEX)")
        low = stored.min(axis=0).astype(np.float32)
        span = stored.max(axis=0).astype(np.float32) - low
        if not (span > 0).any():
            # NOTE: every vector the same (the same text twice, or texts the model does not tell apart): no range to
            # learn; each code was -128, as one vector's would be
            raise ValueError(f"calibrating int8 ranges needs at least 2 different vectors; these {len(stored)} are "
                             "one and the same (embed other texts with them, or take the ranges of an index built "
                             "with this model: --calibration INDEX)")
        return self.with_calibration(low, span)

    def with_calibration(self, low: np.ndarray, span: np.ndarray) -> OutputTransform:
        return replace(self, calibration=Calibration(tuple(float(v) for v in low), tuple(float(v) for v in span)))

    def _round(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.float16).astype(np.float32) if self.output_dtype == "float16" else x


def calibrated_codes(stored: np.ndarray, calibration: Calibration) -> np.ndarray:
    """int8 codes of FAISS SQ8's codec: ``floor(255 clip((x - low) / span, 0, 1)) - 128``."""
    low, span = calibration.arrays()
    unit = np.clip((stored - low) / np.where(span > 0, span, np.float32(1)), 0.0, 1.0)
    return (np.floor(255.0 * unit).astype(np.int16) - 128).astype(np.int8)


def calibrated_decode(codes: np.ndarray, calibration: Calibration) -> np.ndarray:
    """The float vectors int8 ``codes`` stand for (FAISS SQ8 decodes to the middle of each step)."""
    low, span = calibration.arrays()
    return low + (codes.astype(np.float32) + 128.5) / 255.0 * span
