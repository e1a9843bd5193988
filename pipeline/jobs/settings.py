"""Keyword settings of the Python API (and the CLI's flags) -> the frozen config dataclasses.

``petal.index(sources, out, dim=256, index_memory="4G")`` names a field of ``IndexJob`` or of one of
the dataclasses it holds (``ReadConfig``, ``IndexSettings``, ``ModelOptions``, ``OutputConfig``), or
one of the CLI's spellings in ``ALIASES``. An unknown keyword is a ``TypeError`` naming it; a value a
dataclass refuses is a ``UsageError`` (exit 2, also a ``ValueError``).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import operator
import os
import sys
from collections.abc import Callable, ItemsView, Iterable, KeysView, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from petal.engine.config import ATTENTION_BACKENDS, DTYPE_NAMES, ModelOptions
from petal.engine.errors import ModelError, ModelFlagError
from petal.pipeline.config import (
    BadRowBudget,
    IndexJob,
    IndexSettings,
    ReadConfig,
    RemovalLimit,
    ScaleConfig,
    parse_keep_columns,
    parse_size,
    size_problem,
)
from petal.pipeline.reliability.errors import (
    ArgumentTypeError,
    ConfigError,
    FlagError,
    PetalError,
    UsageError,
    quote_path,
    quote_text,
    unknown_keyword,
)
from petal.pipeline.store.outputs import OutputConfig

if TYPE_CHECKING:
    from petal.pipeline.manifest import Manifest

T = TypeVar("T")

# IndexJob's nested dataclasses, by the field that holds them
SECTIONS: dict[str, type] = {"read": ReadConfig, "index": IndexSettings, "model_options": ModelOptions,
                             "output": OutputConfig, "scale": ScaleConfig}
# the CLI's flag names -> field names
ALIASES = {"index_factory": "factory", "index_memory": "memory_bytes", "keep_unused": "keep_unused_s"}


def petal_error(exc: ValueError) -> PetalError:
    """The ``PetalError`` of a ``ValueError``: a model's ``ModelError`` is a configuration error (78), a flag the
    model cannot take (``ModelFlagError``) a ``FlagError`` (2), any other a bad setting (``UsageError``, 2)."""
    if isinstance(exc, PetalError):
        return exc
    if isinstance(exc, ModelFlagError):
        return FlagError(str(exc))
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


def whole_number(value: Any, name: str, minimum: int | None = None) -> int:
    """An integer argument (an ``int`` or a numpy integer; never a bool, float or str): ``UsageError`` naming
    ``name`` otherwise, or when below ``minimum``."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise ArgumentTypeError(f"{name} {value!r} is {kind_of(value)}, not an integer")
    try:
        number = operator.index(value)
    except TypeError:  # NOTE: a numpy array has __index__ (only a 0-d integer one answers it): no integer
        raise ArgumentTypeError(f"{name} {value!r} is {kind_of(value)}, not an integer") from None
    if minimum is not None and number < minimum:
        raise UsageError(f"{name} {number} < {minimum}")
    return number


def numpy_bool(value: Any) -> bool:
    """``value`` is numpy's bool (``np.True_``, an element of a bool array), which is no ``bool`` subclass: taken where
    a ``bool`` is (told without importing numpy)."""
    kind = type(value)
    return kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")


def kind_of(value: Any) -> str:
    """``value``'s type for a message: "a str", "an int"; a type from a library with its package ("a numpy.bool", not
    "a bool": ``wait=np.True_`` was refused as 'a bool, not bool')."""
    kind = type(value)
    package = kind.__module__.split(".")[0]
    name = kind.__name__ if package == "builtins" else f"{package}.{kind.__name__}"
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


# What ``Embedder.encode`` and ``Index.search`` take as texts (``text_items`` judges it at run time): one text, or an
# ordered collection of texts and nulls (a list, tuple, generator, numpy array, pandas column, pyarrow array)
Texts = str | bytes | Iterable[str | bytes | None]


TEXTS_TAKEN = ("one str (or UTF-8 bytes) or an iterable of them (a list, tuple, generator, numpy array of str, pandas "
               "Series, pyarrow array; None for a missing text)")


def is_tensor(value: Any) -> bool:
    """``value`` is a torch tensor (told without importing torch: one exists only once torch is loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def text_items(texts: Any, name: str, hint: str = "") -> list[Any]:
    """One text (str or UTF-8 bytes) or an ordered iterable (list, tuple, generator, ``dict.keys()``), numpy array,
    pandas column or pyarrow ``Array``/``ChunkedArray`` of them, as a list; a missing text (``None``, a float NaN,
    ``pandas.NA``: how pandas and numpy hold a null) is ``None``, which the caller's text rule skips. Anything else
    (a dict, a set, a bytearray, an item that is not a str) is a ``UsageError`` naming ``name`` and the type
    (``hint`` appended)."""
    if isinstance(texts, (str, bytes)):
        return [texts]  # one text, never its characters (or bytes)
    if isinstance(texts, (bytearray, memoryview)):  # NOTE: iterated, their bytes are ints
        raise ArgumentTypeError(f"{name}: {kind_of(texts)} is not a text (str or UTF-8 bytes) or a list of them{hint}")
    arrow = sys.modules.get("pyarrow")  # NOTE: loaded wherever a pyarrow array exists; never imported for this
    if arrow is not None and isinstance(texts, (arrow.Array, arrow.ChunkedArray)):
        items: list[Any] = texts.to_pylist()  # str, bytes and None (iterated: StringScalar objects)
    elif hasattr(texts, "tolist") and hasattr(texts, "ndim"):  # a numpy array of texts, a pandas column
        if is_tensor(texts) or getattr(getattr(texts, "dtype", None), "kind", "O") in "biufcmM":
            # NOTE: numbers (a torch tensor, a float array): never texts; each was 'texts[0] is a float, not a str'
            raise ArgumentTypeError(f"{name}: {kind_of(texts)} of {texts.dtype} numbers is not texts: {name} takes "
                                    f"{TEXTS_TAKEN}{hint}")
        if texts.ndim > 1:  # NOTE: its rows came out as lists: 'texts[0] is a list, not a str' named no array
            raise ArgumentTypeError(f"{name}: {kind_of(texts)} of shape {tuple(texts.shape)} is {texts.ndim}-D: "
                                    f"pass a 1-D array or a list of texts ({name}.ravel() for one text a cell){hint}")
        items = [texts.item()] if texts.ndim == 0 else texts.tolist()
    elif hasattr(texts, "keys") or (isinstance(texts, AbstractSet) and not isinstance(texts, (KeysView, ItemsView))):
        # NOTE: a dict (or a DataFrame) iterates its keys, a set in no order the caller can match rows to: the
        # rows would silently be of other texts, or in another order
        what = "iterating it gives its keys, not its values" if hasattr(texts, "keys") else "it has no order"
        raise ArgumentTypeError(f"{name}: {kind_of(texts)} is not a list of texts ({what}): pass a list or tuple of "
                         f"str{hint}")
    else:
        try:
            items = list(texts)
        except TypeError:
            raise ArgumentTypeError(f"{name}: {kind_of(texts)} is not a text (str) or a list of them{hint}") from None
    pandas_na = getattr(sys.modules.get("pandas"), "NA", None)
    items = [None if text is pandas_na or (isinstance(text, float) and math.isnan(text)) else text for text in items]
    bad = next((i for i, text in enumerate(items) if text is not None and not isinstance(text, (str, bytes))), None)
    if bad is not None:
        raise ArgumentTypeError(f"{name}[{bad}] is {kind_of(items[bad])}, not a str: {name} takes {TEXTS_TAKEN}"
                                f"{hint}")
    return items


def typed(cls: type, values: dict[str, Any], caller: str) -> dict[str, Any]:
    """``values`` for ``cls``'s fields, each of the plain type its field declares (``int``, ``float``, ``bool``,
    ``str``, or one of them or ``None``): the CLI's flags arrive typed, a keyword may not (``dim="16"``,
    ``dim=16.5``, ``wait="no"``): ``UsageError`` naming it, not a ``TypeError`` from a comparison deep inside
    (or a float taken as a count). A numpy integer becomes an ``int``; other field types are checked where built."""
    hints = _hints(cls)
    checked = dict(values)
    for name, value in values.items():
        allowed = _plain_types(hints.get(name))
        if allowed is None or (value is None and type(None) in allowed):
            continue
        if bool in allowed and numpy_bool(value):
            checked[name] = bool(value)
        elif int in allowed and not isinstance(value, bool) and hasattr(type(value), "__index__") \
                and not numpy_bool(value):
            checked[name] = operator.index(value)
        elif float in allowed and isinstance(value, numbers.Real) and not isinstance(value, bool) \
                and not numpy_bool(value):
            # NOTE: an int too (target_recall=1): kept as given, the report and warnings said 1 where the CLI's 1.0;
            # one past a float's range is left to the field's own bound check (its message quotes it)
            with contextlib.suppress(OverflowError):
                checked[name] = float(value)  # numpy.float32: a float
        elif not any(isinstance(value, t) and (t is not int or not isinstance(value, bool)) for t in allowed):
            spelled = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
            keyword = next((key for key, field_name in ALIASES.items() if field_name == name), name)
            raise ArgumentTypeError(f"{caller}: {keyword}={value!r} is {kind_of(value)}, not {spelled}")
    return checked


_PLAIN = (int, float, bool, str, type(None))


def _hints(cls: type) -> dict[str, Any]:
    import typing

    try:
        return typing.get_type_hints(cls)
    except (NameError, TypeError):  # an annotation that does not resolve: nothing checked here
        return {}


def _plain_types(hint: Any) -> tuple[type, ...] | None:
    """The types of a field declared ``int``, ``str | None``, ... (``None``: another kind of field, unchecked)."""
    import types
    import typing

    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if not options or not all(option in _PLAIN for option in options):
        return None
    return tuple(options)


def model_options(**settings: Any) -> ModelOptions:
    """``ModelOptions`` from ``pooling``, ``attention_mask``, ``query_prompt``, ``allow_pickle_weights``."""
    return build(ModelOptions, **settings)


def _field_names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def _convert(name: str, value: Any) -> Any:
    """Values the CLI gives as text, accepted in either form."""
    if name == "memory_bytes" and isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as exc:  # the flag (keyword index_memory) it came from, as --max-bad-rows names its own
            raise UsageError(f"--index-memory: {exc}") from exc
    if name == "memory_bytes" and isinstance(value, int):
        problem = size_problem(value)
        if problem is not None:
            raise UsageError(f"--index-memory {problem}")
    if name == "max_bad_rows" and value is not None and not isinstance(value, BadRowBudget):
        return build(BadRowBudget.parse, str(value))
    if name == "max_removed" and value is not None:
        return value if isinstance(value, RemovalLimit) else build(RemovalLimit.parse, str(value))
    if name == "keep_unused_s" and value is not None and not isinstance(value, bool):
        from petal.pipeline.config import parse_duration  # "7d", "12h", or seconds

        return build(parse_duration, str(value))
    if name == "keep_columns" and (value is None or isinstance(value, str)):
        return build(parse_keep_columns, value)  # "lang,url"; a list or tuple of names is taken as it is
    if name == "keep_columns":
        return tuple(value) if isinstance(value, Iterable) else (value,)  # keep_columns=5: judged as a name
    if name == "model" and isinstance(value, (str, os.PathLike)):
        return model_path(value, "model")  # a model directory as a Path: its str
    if name in ("json_report", "out", "delete") and value is not None:
        return out_path(value, name)
    return value


def sources_tuple(sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> tuple[str, ...]:
    """One source or many: Parquet files, directories or globs."""
    if isinstance(sources, (str, os.PathLike)):
        return (os.fspath(sources),)
    if isinstance(sources, (bytes, bytearray, memoryview)):  # NOTE: iterable, but not of paths (b"/x" -> 47, ...)
        raise ArgumentTypeError(f"sources: {sources!r} is {kind_of(sources)}, not a path, a glob or a list of them")
    try:
        given = list(sources)
    except TypeError:
        raise ArgumentTypeError(f"sources: {kind_of(sources)} is not a path, a glob or a list of them") from None
    bad = next((i for i, s in enumerate(given) if not isinstance(s, (str, os.PathLike))), None)
    if bad is not None:  # NOTE: an index: the item found may be None itself
        raise ArgumentTypeError(f"sources: {given[bad]!r} is {kind_of(given[bad])}, not a path or a glob")
    return tuple(os.fspath(s) for s in given)


def out_path(out: Any, name: str = "out") -> Path:
    """A path argument (any but a source) as the local ``Path`` it names, as the CLI's ``PathParam`` converts it
    (``remote.path_argument``): a ``file://`` URL is the local path; ``UsageError`` naming ``name`` when it is not a
    path, an empty one, or another URL (``s3://bucket/idx``: only a source is read from object storage)."""
    if not isinstance(out, (str, os.PathLike)):
        raise ArgumentTypeError(f"{name}: {out!r} is {kind_of(out)}, not a path")
    not_empty_path(out, name)
    from petal.pipeline.ingest.remote import path_argument

    try:
        return path_argument(out)
    except UsageError as exc:  # NOTE: was taken for a relative path: index(SRC, "s3://b/idx") wrote ./s3:/b/idx
        raise UsageError(f"{name}: {exc}") from None


def index_job(sources: str | os.PathLike[str] | Iterable[str | os.PathLike[str]], out: str | os.PathLike[str],
              caller: str = "petal.index()", takes: Iterable[str] = (), /, **settings: Any) -> IndexJob:
    """The ``IndexJob`` that ``settings`` describe (see the module docstring). A keyword that is no setting is an
    ``ArgumentTypeError`` (2, a ``TypeError``) naming it and its close matches among the settings and ``takes``
    (the caller's own keywords)."""
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
            if owner is None:  # NOTE: was a bare TypeError: no report, and no PetalError for a caller to catch
                known = {*top, *ALIASES, *SECTIONS, "no_cuda_graphs", *takes}
                known |= {name for cls in SECTIONS.values() for name in _field_names(cls)} - set(ALIASES.values())
                raise unknown_keyword(caller, key, known)
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
    direct = typed(IndexJob, direct, caller)
    for section, values in nested.items():
        values = typed(SECTIONS[section], values, caller)
        if section == "scale" and not values:
            continue
        if values and section in direct:
            raise TypeError(f"{caller}: give {section}= or its fields ({', '.join(values)}), not both")
        if section not in direct:
            direct[section] = build(SECTIONS[section], **values)
    direct.setdefault("model", None)  # the packaged default
    job = build(IndexJob, sources=sources_tuple(sources), out=out_path(out), **direct)
    check_factory(job)
    return job


def check_factory(job: IndexJob) -> None:
    """An explicit index factory that the output format cannot take is a usage error."""
    from petal.pipeline.index.plan import check_index_factory, index_kind

    build(check_index_factory, job.index, index_kind(job.output.quantize, job.output.output_dtype))


# NOTE: (flag, keyword, the value that means "not given") of every setting a --vectors-column run has no use for:
# the model's, the output transform's and the scale-out's (such a run reads vectors in one process, no model)
_UNUSED_BY_VECTORS = (
    ("--model", "model", None), ("--dim", "dim", None), ("--quantize", "quantize", "none"),
    ("--output-dtype", "output_dtype", "float32"), ("--device", "device", "auto"), ("--dtype", "dtype", "auto"),
    ("--attention", "attention", "auto"), ("--max-length", "max_length", None),
    ("--token-budget", "token_budget", None), ("--max-seqs", "max_seqs", 256),
    ("--no-cuda-graphs", "cuda_graphs", True), ("--pooling", "pooling", None),
    ("--attention-mask", "attention_mask", None), ("--query-prompt", "query_prompt", None),
    ("--allow-pickle-weights", "allow_pickle_weights", False), ("--devices", "devices", None),
    ("--workers", "workers", None), ("--ray", "ray", False), ("--range-rows", "range_rows", None),
)


def check_vectors_flags(settings: dict[str, Any]) -> None:
    """``vectors_column`` (``--vectors-column``) indexes the vectors as they are, in one process: no model, no output
    transform, no scale-out (``UsageError`` naming the flags given: they would set nothing)."""
    given = [flag for flag, key, unset in _UNUSED_BY_VECTORS if key in settings and settings[key] != unset]
    if given:
        raise UsageError("--vectors-column indexes precomputed vectors as they are, in one process, without a model; "
                         + (f"{given[0]} does not apply: leave it out" if len(given) == 1
                            else f"{', '.join(given)} do not apply: leave them out"))


def index_settings(caller: str = "petal.rebuild()", takes: Iterable[str] = (), /, **settings: Any) -> IndexSettings:
    """``IndexSettings`` from keywords (``index_factory``/``factory``, ``metric``, ``index_memory``, ...); another
    keyword is an ``ArgumentTypeError`` naming it and its close matches among them and ``takes`` (the caller's
    own keywords)."""
    known = _field_names(IndexSettings)
    values: dict[str, Any] = {}
    for key, value in settings.items():
        name = ALIASES.get(key, key)
        if name not in known:
            raise unknown_keyword(caller, key, {*ALIASES, *(known - set(ALIASES.values())), *takes})
        values[name] = _convert(name, value)
    return build(IndexSettings, **typed(IndexSettings, values, caller))


def unset_index_settings_dropped(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` without an index setting given as ``None`` (``metric=None``, ``index_factory=None``...): left
    out, as a flag not given, so it keeps the live version's (a first run's default). NOTE: was an
    ``ArgumentTypeError`` ("metric=None is NoneType, not str") for a caller forwarding an optional argument."""
    known = _field_names(IndexSettings)
    return {key: value for key, value in settings.items()
            if not (value is None and ALIASES.get(key, key) in known)}


def given_index_settings(settings: Mapping[str, Any]) -> frozenset[str] | None:
    """The ``IndexSettings`` fields among keyword ``settings`` (``index_factory``, ``metric``, ...: the CLI passes only
    the flags given); ``None`` (all of them) when the whole section is given (``index=IndexSettings(...)``)."""
    if "index" in settings:
        return None
    known = _field_names(IndexSettings)
    return frozenset(name for name in (ALIASES.get(key, key) for key in settings) if name in known)


def kept_settings(previous: Manifest | None, settings: IndexSettings, given: frozenset[str] | None) -> IndexSettings:
    """``settings`` where the caller chose them (``given``; ``None``: all), the live version's (``previous``; ``None``:
    a first run, ``settings`` as they are) elsewhere: its factory as asked for (``auto`` stays ``auto``: the size
    decides), metric, memory budget, target recall, seed... (``petal index`` and ``petal rebuild`` alike)."""
    if given is None or previous is None:
        return settings
    return replace(previous.index.settings, **{name: getattr(settings, name) for name in given})


def check_kept_factory(settings: IndexSettings, kind: str, dim: int | None, num_vectors: int | None,
                       given: frozenset[str] | None, manifest: Path, counted: str | None = None,
                       live: IndexSettings | None = None, *, kept_output: bool = False) -> None:
    """``check_index_factory`` of ``settings`` (``kept_settings``): an ``--index-factory`` given is a usage error (2)
    as ever; one kept from the live version (``manifest``: its file) that cannot be built now is a ``ConfigError``
    (78) naming it and the way out, never a usage error of a flag the user did not give. A kept factory that the
    flags given make unbuildable (``live``: the live version's own settings, under which it builds: ``--metric ip``
    over an l2-only factory, a smaller ``--index-memory`` that cannot train it) is those flags' usage error (2).
    ``counted``: what ``num_vectors`` counts, as the message says it (``None``: ``plan.UPPER_BOUND``, a run's before
    any work). ``kept_output``: ``kind`` is the live version's output, which ``petal rebuild`` keeps."""
    from petal.pipeline.index.plan import UPPER_BOUND, TrainingMemoryError, check_index_factory

    try:
        check_index_factory(settings, kind, dim, num_vectors, counted or UPPER_BOUND, kept_output=kept_output)
    except FlagError as exc:
        # NOTE: a kept factory that a smaller --index-memory given cannot train is that flag's usage error (2)
        if given is None or "factory" in given or (isinstance(exc, TrainingMemoryError) and "memory_bytes" in given):
            raise
        flags = _given_index_flags(settings, given)
        if flags and live is not None and _builds(live, kind, dim, num_vectors, counted or UPPER_BOUND):
            # NOTE: was 78 'the live version's index factory cannot be built again' for `petal rebuild OUT --metric ip`
            # over an l2-only factory: the live version is fine, the flag given is what cannot be built
            raise FlagError(f"{flags} with the live version's index factory {settings.factory!r} (kept as no "
                            f"--index-factory was given): {exc}") from exc
        raise ConfigError(f"{quote_path(manifest)}: the live version's index factory {quote_text(settings.factory)}, "
                          f"kept as no --index-factory was given, cannot be built again: {exc}; give "
                          "--index-factory") from exc


_INDEX_FLAGS = {"metric": "--metric", "memory_bytes": "--index-memory", "target_recall": "--target-recall"}


def _given_index_flags(settings: IndexSettings, given: frozenset[str]) -> str:
    """The index flags among ``given`` as a user gave them (``--metric ip --index-memory 1048576``), in flag order."""
    return " ".join(f"{flag} {getattr(settings, name)}" for name, flag in _INDEX_FLAGS.items() if name in given)


def _builds(settings: IndexSettings, kind: str, dim: int | None, num_vectors: int | None, counted: str) -> bool:
    """Whether ``check_index_factory`` passes ``settings``."""
    from petal.pipeline.index.plan import check_index_factory

    try:
        check_index_factory(settings, kind, dim, num_vectors, counted)
    except FlagError:
        return False
    return True


def not_empty_path(path: Any, name: str) -> None:
    """An empty str is no path (an unset variable), never the current directory that ``Path("")`` makes of it:
    ``UsageError`` naming ``name``."""
    if isinstance(path, str) and not path:
        raise UsageError(f"{name}: an empty path; give a path ('.' for the current directory)")
    no_nul_byte(path, name)


def no_nul_byte(path: Any, name: str) -> None:
    """A path holding a NUL byte names no file (``UsageError`` naming ``name``). NOTE: the OS takes none: ``os.stat``
    raised a bare ``ValueError`` ('embedded null byte'), a traceback from the API, never a ``PetalError``."""
    raw = os.fspath(path) if isinstance(path, (str, bytes, os.PathLike)) else None
    if raw is not None and ("\0" in raw if isinstance(raw, str) else b"\0" in raw):
        raise UsageError(f"{name}: {quote_text(os.fsdecode(raw))} holds a NUL byte, which no path can hold")


_MODEL_CHOICES = {"device": ("auto", "cpu", "cuda"), "dtype": ("auto", *DTYPE_NAMES), "attention": ATTENTION_BACKENDS}


def check_model_settings(settings: dict[str, Any], caller: str) -> str | None:
    """The model settings among ``settings`` as the CLI's flag parsing judges them: ``model`` a str or path,
    ``device``/``dtype``/``attention`` one of their choices, ``query_prompt`` a str or None, ``allow_pickle_weights``
    a bool (else a ``UsageError`` naming it). Judged without loading torch or the model. Returns ``model`` as
    ``model_path`` gives it (a ``file://`` URL the local directory), ``None`` when it is not given."""
    model = settings.get("model")
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise ArgumentTypeError(f"{caller}: model={model!r} is {kind_of(model)}, not str or a path")
    if model is not None:
        model = model_path(model, f"{caller}: model")
    typed(ModelOptions, {key: settings[key] for key in ("query_prompt", "allow_pickle_weights") if key in settings},
          caller)
    for name, choices in _MODEL_CHOICES.items():
        if name not in settings:
            continue
        value = settings[name]
        if not isinstance(value, str):
            raise ArgumentTypeError(f"{caller}: {name}={value!r} is {kind_of(value)}, not str")
        if value not in choices:
            raise UsageError(f"{caller}: {name}={value!r} is not one of {', '.join(choices)}")
    return model


def model_path(model: Any, name: str) -> str:
    """``model`` (a directory or a cached Hugging Face id) as a str, a ``file://`` URL as the local directory it names
    (``remote.model_argument``, as ``--model``'s); one that is not a str or a path, an empty one, or another URL is a
    ``UsageError`` naming ``name``: ``model=""`` (an unset variable) is not the packaged default, which ``None`` (or
    leaving it out) asks for."""
    if not isinstance(model, (str, os.PathLike)):
        raise ArgumentTypeError(f"{name}: {model!r} is {kind_of(model)}, not a path")
    path = os.fspath(model)
    if not path:
        raise UsageError(f"{name}: an empty path; leave it out (None) for the packaged model")
    no_nul_byte(path, name)
    from petal.pipeline.ingest.remote import model_argument

    try:
        return model_argument(path)  # NOTE: file:///m is the directory /m (was looked for at ./file:/m), as --model's
    except UsageError as exc:
        raise UsageError(f"{name}: {exc}") from None
