"""Keyword settings of the Python API (and the CLI's flags) -> the frozen config dataclasses.

``petal.index(sources, out, dim=256, index_memory="4G")`` names a field of ``IndexJob`` or of one of
the dataclasses it holds (``ReadConfig``, ``IndexSettings``, ``ModelOptions``, ``OutputConfig``), or
one of the CLI's spellings in ``ALIASES``. An unknown keyword is a ``TypeError`` naming it; a value a
dataclass refuses is a ``UsageError`` (exit 2, also a ``ValueError``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from petal.engine.config import ModelOptions
from petal.engine.errors import ModelError
from petal.pipeline.config import (
    BadRowBudget,
    IndexJob,
    IndexSettings,
    ReadConfig,
    RemovalLimit,
    ScaleConfig,
    parse_keep_columns,
    parse_size,
)
from petal.pipeline.reliability.errors import ConfigError, PetalError, UsageError
from petal.pipeline.store.outputs import OutputConfig

T = TypeVar("T")

# IndexJob's nested dataclasses, by the field that holds them
SECTIONS: dict[str, type] = {"read": ReadConfig, "index": IndexSettings, "model_options": ModelOptions,
                             "output": OutputConfig, "scale": ScaleConfig}
# the CLI's flag names -> field names
ALIASES = {"index_factory": "factory", "index_memory": "memory_bytes"}


def petal_error(exc: ValueError) -> PetalError:
    """The ``PetalError`` of a ``ValueError``: a model's ``ModelError`` is a configuration error (78),
    any other a bad setting (``UsageError``, 2)."""
    if isinstance(exc, PetalError):
        return exc
    if isinstance(exc, ModelError):
        return ConfigError(str(exc))
    return UsageError(str(exc))


def build(make: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``make(*args, **kwargs)``; the ``ValueError`` of a check becomes a ``UsageError`` (exit 2)."""
    try:
        return make(*args, **kwargs)
    except ValueError as exc:
        error = petal_error(exc)
        if error is exc:
            raise
        raise error from exc


def model_options(**settings: Any) -> ModelOptions:
    """``ModelOptions`` from ``pooling``, ``attention_mask``, ``query_prompt``, ``allow_pickle_weights``."""
    return build(ModelOptions, **settings)


def _field_names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def _convert(name: str, value: Any) -> Any:
    """Values the CLI gives as text, accepted in either form."""
    if name == "memory_bytes" and isinstance(value, str):
        return build(parse_size, value)
    if name == "max_bad_rows" and value is not None and not isinstance(value, BadRowBudget):
        return build(BadRowBudget.parse, str(value))
    if name == "max_removed" and value is not None:
        return value if isinstance(value, RemovalLimit) else build(RemovalLimit.parse, str(value))
    if name == "keep_columns" and (value is None or isinstance(value, str)):
        return build(parse_keep_columns, value)  # "lang,url"; a list or tuple of names is taken as it is
    if name == "keep_columns":
        return tuple(value)
    if name in ("json_report", "out", "delete") and value is not None:
        return Path(value)
    return value


def sources_tuple(sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> tuple[str, ...]:
    """One source or many: Parquet files, directories or globs."""
    if isinstance(sources, (str, os.PathLike)):
        return (os.fspath(sources),)
    return tuple(os.fspath(s) for s in sources)


def index_job(sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], out: str | os.PathLike[str],
              caller: str = "petal.index()", **settings: Any) -> IndexJob:
    """The ``IndexJob`` that ``settings`` describe (see the module docstring)."""
    top = _field_names(IndexJob) - set(SECTIONS) - {"sources", "out"}
    direct: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    for key, value in settings.items():
        if key == "no_cuda_graphs":
            direct["cuda_graphs"] = not value
            continue
        name = ALIASES.get(key, key)
        if name in SECTIONS and isinstance(value, SECTIONS[name]):
            direct[name] = value  # a whole section given as its dataclass
        elif name in top:
            direct[name] = _convert(name, value)
        else:
            owner = next((s for s, cls in SECTIONS.items() if name in _field_names(cls)), None)
            if owner is None:
                raise TypeError(f"{caller} got an unexpected keyword argument {key!r}")
            nested[owner][name] = _convert(name, value)
    read = nested["read"]
    if read.get("id_column") is None:
        read.pop("id_column", None)  # None: the default column, which may be absent
    elif "id_column_required" not in read:
        read["id_column_required"] = True  # named by the caller: absent is then an error
    # none of devices, workers, ray given: embed in this process (scale None)
    nested["scale"] = {k: v for k, v in nested["scale"].items() if v is not None and v is not False}
    if set(nested["scale"]) == {"range_rows"}:
        raise UsageError("--range-rows cuts large shards for worker processes or Ray actors: it goes with "
                         "--devices, --workers or --ray")
    for section, values in nested.items():
        if section == "scale" and not values:
            continue
        if values and section in direct:
            raise TypeError(f"{caller}: give {section}= or its fields ({', '.join(values)}), not both")
        if section not in direct:
            direct[section] = build(SECTIONS[section], **values)
    direct.setdefault("model", None)  # the packaged default
    job = build(IndexJob, sources=sources_tuple(sources), out=Path(out), **direct)
    check_factory(job)
    return job


def check_factory(job: IndexJob) -> None:
    """An explicit index factory that the output format cannot take is a usage error."""
    from petal.pipeline.index.plan import check_index_factory, index_kind

    build(check_index_factory, job.index, index_kind(job.output.quantize, job.output.output_dtype))


def check_vectors_flags(settings: dict[str, Any]) -> None:
    """``vectors_column`` (``--vectors-column``) indexes the vectors as they are: no model, no output transform
    (``UsageError`` naming the flags given)."""
    given = [flag for flag, on in (("--model", settings.get("model") is not None),
                                   ("--dim", settings.get("dim") is not None),
                                   ("--quantize", settings.get("quantize", "none") != "none"),
                                   ("--output-dtype", settings.get("output_dtype", "float32") != "float32"))
             if on]
    if given:
        raise UsageError(f"--vectors-column indexes precomputed vectors as they are; {', '.join(given)} do not apply")


def index_settings(caller: str = "petal.rebuild()", **settings: Any) -> IndexSettings:
    """``IndexSettings`` from keywords (``index_factory``/``factory``, ``metric``, ``index_memory``, ...)."""
    known = _field_names(IndexSettings)
    values: dict[str, Any] = {}
    for key, value in settings.items():
        name = ALIASES.get(key, key)
        if name not in known:
            raise TypeError(f"{caller} got an unexpected keyword argument {key!r}")
        values[name] = _convert(name, value)
    return build(IndexSettings, **values)
