"""Request bodies of ``/v1/embeddings`` and ``/search``: parsed and checked before any work.

A malformed body is refused with a message that names the field: 400 for what is not JSON (or not
an object), 422 for a wrong type, a missing, unknown or repeated field, a ``k`` over ``--max-k`` or a
number outside its range, 413 for more texts than ``--max-texts`` (tokens per text are checked after
tokenization, on the engine thread: ``batcher.py``). ``null`` stands for an absent optional field.
Texts follow the rule of every text petal embeds (``ingest/text_rule.py``, as ``petal query``): one
without a visible character is refused as empty, a lone surrogate is read as U+FFFD.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from petal.pipeline.index.bounds import MAX_NPROBE, MAX_RESCORE
from petal.pipeline.ingest.text_rule import decoded_json_text, skip_reason
from petal.pipeline.serve.encoding import duplicate_key, loads
from petal.pipeline.serve.settings import Limits

SIDES = ("query", "document")
ENCODINGS = ("float", "base64")
INCLUDES = ("text", "metadata")
DEFAULT_K = 10  # /search without "k" (or --max-k, when lower)


def default_k(max_k: int) -> int:
    """The ``k`` of a ``/search`` that leaves it out: ``DEFAULT_K``, or ``--max-k`` when that is lower."""
    return min(DEFAULT_K, max_k)


# a message that begins with the field it is about: "'dimensions' must be ...", "input item 3 has ...", "'k' is ..."
FIELD_FIRST = re.compile(r"'(\w+)'|(\w+) item \d")


class RequestError(Exception):
    """A client mistake: ``status`` (4xx), an OpenAI-style ``kind`` and a message naming the field; ``param`` (OpenAI's
    error ``param``): the request field it is about, given, else the one the message begins with (``FIELD_FIRST``),
    else ``None``."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.headers = headers or {}
        first = FIELD_FIRST.match(message)
        self.param = param if param is not None or first is None else first.group(1) or first.group(2)


def limit_message(name: str, item: int, max_tokens: int) -> str:
    """The 413 message of a text over the tokens-per-text limit (``name``: the request's field)."""
    return (f"{name} item {item} has more than {max_tokens} tokens, the limit per text "
            f"(--max-tokens-per-text / the model's max length); shorten it or send \"truncate\": true")


def chars_message(name: str, item: int, chars: int, max_chars: int, empty: bool = False) -> str:
    """The 413 message of a text over the characters petal reads of a text (``TextTokenizer.max_text_chars``, from
    its first token), which hold fewer tokens than the limit (one huge unknown word): cut there, it is truncated,
    though not at the token limit. ``empty``: those characters hold nothing the model sees (a leading run of
    characters the tokenizer drops, not passed over: ``TextTokenizer._first_token_at`` found no token within its
    bound): truncated, the text is empty (422), so ``truncate`` is not offered. NOTE: it was, and following the
    advice got the 422."""
    if empty:
        return (f"{name} item {item} has {chars} characters, over the {max_chars} petal reads of a text, and those "
                f"hold nothing the model sees (blank, or characters its tokenizer drops): \"truncate\" would leave "
                f"an empty text; shorten it (what the model would see of it, if anything, comes after character "
                f"{max_chars})")
    return (f"{name} item {item} has {chars} characters, over the {max_chars} petal reads of a text (they hold "
            f"fewer tokens than the limit per text); shorten it or send \"truncate\": true")


@dataclass(frozen=True)
class EmbeddingsRequest:
    texts: tuple[str, ...] | None  # or token ids
    token_ids: tuple[np.ndarray, ...] | None  # int64 (object: an id past int64, kept for the message)
    model: str | None
    dimensions: int | None
    encoding_format: str
    input_type: str
    truncate: bool

    @property
    def held_bytes(self) -> int:
        """The memory this request holds while it waits for its answer (texts or token ids)."""
        return _held_bytes(self.texts, self.token_ids or ())


@dataclass(frozen=True)
class SearchRequest:
    texts: tuple[str, ...] | None
    vectors: np.ndarray | None  # [n, dim] float32, every value finite
    k: int
    nprobe: int | None
    rescore: int | None
    include: tuple[str, ...]
    truncate: bool
    where: str | None = None  # a filter on kept columns (pipeline/index/filters.py), inside the FAISS search
    field: str = "query"  # the request's field holding ``texts`` ("query" or "queries"): its errors name it

    @property
    def held_bytes(self) -> int:
        """The memory this request holds while it waits for its answer (texts or vectors, and the filter)."""
        arrays = (self.vectors,) if self.vectors is not None else ()
        return _held_bytes(self.texts, arrays) + (sys.getsizeof(self.where) if self.where is not None else 0)


def _held_bytes(texts: tuple[str, ...] | None, arrays: tuple[np.ndarray, ...]) -> int:
    """Bytes of ``texts`` as Python strings (1, 2 or 4 bytes a character: a text of ASCII and one emoji is 4 bytes a
    character) and of ``arrays`` (token ids: 8 bytes each, from 2 bytes of JSON, ``7,``).
    NOTE: a body's parsed form may hold ~4x its bytes: ``BodyBudget`` counts the larger of the two."""
    return sum(map(sys.getsizeof, texts or ())) + sum(a.nbytes for a in arrays)


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        value = loads(body)
        repeated = duplicate_key(body, value) if isinstance(value, dict) else None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"the body is not valid JSON (UTF-8): {exc}") from exc
    except RecursionError as exc:
        raise RequestError(400, "the body is not valid JSON here: nested too deeply") from exc
    except ValueError as exc:  # an integer of thousands of digits (Python's int_max_str_digits)
        raise RequestError(400, f"the body is not valid JSON here: {str(exc).split(';')[0]}") from exc
    if not isinstance(value, dict):
        raise RequestError(400, f"the body must be a JSON object, not {_kind(value)}")
    if repeated is not None:
        raise RequestError(422, f"field {repeated!r} is given more than once", param=repeated)
    return value


def _kind(value: Any) -> str:
    """The JSON name of ``value``'s type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return repr(value)  # "must be an integer, not 2.5"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _unknown(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    extra = sorted(set(body) - set(allowed))
    if extra:
        raise RequestError(422, f"unknown field(s) {', '.join(map(repr, extra))}; allowed: {', '.join(allowed)}",
                           param=extra[0][:100])  # NOTE: OpenAI's error.param: the (first) field named, cut


def _int(body: dict[str, Any], name: str, default: int | None, low: int, high: int | None = None,
         limit_flag: str = "") -> int | None:
    value = body.get(name)
    if value is None:  # absent or null: the default
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(422, f"{name!r} must be an integer, not {_kind(value)}")
    if value < low:
        raise RequestError(422, f"{name!r} must be >= {low}, got {value}")
    if high is not None and value > high:
        flag = f" ({limit_flag})" if limit_flag else ""
        raise RequestError(422, f"{name!r} is {value}, over the limit of {high}{flag}")
    return value


def _choice(body: dict[str, Any], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, str) or value not in choices:
        raise RequestError(422, f"{name!r} must be one of {', '.join(choices)}, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    """A client's value for a message: a string or a number as written, an array or an object by its kind.
    NOTE: never the repr of an array or object: one nested 1000 deep (orjson reads up to 1024) has none, its
    RecursionError was a 500 with a traceback (``"encoding_format": [[[...]]]``)."""
    if isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return repr(value)
    return _kind(value)


def _bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(422, f"{name!r} must be true or false, not {_kind(value)}")
    return value


def _count(n: int, name: str, limits: Limits) -> None:
    if n == 0:
        raise RequestError(422, f"{name!r} is empty")
    if n > limits.max_texts:
        raise RequestError(413, f"{name!r} has {n} items, over the limit of {limits.max_texts} per request "
                                "(--max-texts)")


def _first(values: list[Any], ok: Callable[[Any], bool]) -> int:
    """The index of the first of ``values`` that is not ``ok`` (one exists: the caller's check of them all failed)."""
    return next(i for i, v in enumerate(values) if not ok(v))


def _is_token_id(value: Any) -> bool:
    return type(value) is int  # NOTE: not a bool (an int to Python), not 2.0


def _texts(value: Any, name: str, limits: Limits, shape: str = "a string or a list of strings") -> tuple[str, ...]:
    """``value`` (``shape``: what the field takes, as its errors say) as texts, counted against the limits."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        if isinstance(value, list):
            i = _first(value, lambda t: isinstance(t, str))
            raise RequestError(422, f"{name!r} must be {shape}: item {i} is {_kind(value[i])}")
        raise RequestError(422, f"{name!r} must be {shape}, not {_kind(value)}")
    _count(len(value), name, limits)
    # NOTE: the rule of petal query: a lone surrogate (JSON "\ud800") is U+FFFD, which the tokenizer takes
    texts = tuple(decoded_json_text(t) for t in value)
    empty = [i for i, t in enumerate(texts) if skip_reason(t) is not None]
    if empty:
        raise RequestError(422, f"{name!r} item {empty[0]} is empty (no visible character)")
    return texts


def _all_ints(values: Any) -> bool:
    """Whether every JSON value of ``values`` (an iterable) is an integer (not a bool, a float or anything else).
    NOTE: one pass in C (the set of their types): a Python test of each id took ~10 ms of the event loop for 256 lists
    of 512 token ids."""
    return set(map(type, values)) == {int}


def _token_arrays(lists: list[list[int]]) -> tuple[np.ndarray, ...]:
    """Each list of integers as an int64 array (one conversion for them all); ids past int64 (outside any vocabulary)
    as an object array, exact for the message that refuses them."""
    lengths = list(map(len, lists))
    try:
        flat = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=sum(lengths))
    except OverflowError:
        return tuple(np.array(ids, dtype=object) for ids in lists)
    return tuple(np.split(flat, np.cumsum(lengths[:-1]))) if len(lists) > 1 else (flat,)


INPUT_FORMS = "a string, a list of strings, a list of token ids (integers) or a list of such lists"


def _input_error(value: Any) -> RequestError:
    """The 422 of an ``input`` of no accepted form: what it must be, and where it is not (the item, and the position
    in a token-id list). NOTE: before, ``[1.0, 2]`` or ``[1, true]`` was told "must be a string or a list of strings",
    not a word of token ids, nor of which item."""
    if not isinstance(value, list):
        return RequestError(422, f"'input' must be {INPUT_FORMS}, not {_kind(value)}")
    if not value:
        return RequestError(422, f"'input' is empty (an empty list): 'input' must be {INPUT_FORMS}")
    first = value[0]
    if isinstance(first, str):
        i = _first(value, lambda t: isinstance(t, str))
        where = f"item {i} is {_kind(value[i])}, in a list of strings (item 0 is a string)"
    elif _is_token_id(first):
        i = _first(value, _is_token_id)
        where = f"item {i} is {_kind(value[i])}, not a token id (an integer), in a list of token ids (item 0 is one)"
    elif isinstance(first, list):
        i = _first(value, lambda ids: isinstance(ids, list) and bool(ids) and all(map(_is_token_id, ids)))
        ids = value[i]
        if not isinstance(ids, list):
            where = f"item {i} is {_kind(ids)}, not a list of token ids (item 0 is a list)"
        elif not ids:
            where = f"item {i} is an empty list of token ids"
        else:
            j = _first(ids, _is_token_id)
            where = f"item {i} position {j} is {_kind(ids[j])}, not a token id (an integer)"
    else:
        where = f"item 0 is {_kind(first)}, not a string, a token id (an integer) or a list of token ids"
    return RequestError(422, f"'input' {where}: 'input' must be {INPUT_FORMS}")


def parse_embeddings(body: dict[str, Any], limits: Limits) -> EmbeddingsRequest:
    _unknown(body, ("input", "model", "dimensions", "encoding_format", "input_type", "truncate", "user"))
    if body.get("input") is None:
        raise RequestError(422, f"'input' is required: {INPUT_FORMS}")
    value = body["input"]
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(422, "'model' must be a string")
    if body.get("user") is not None and not isinstance(body.get("user"), str):
        raise RequestError(422, "'user' must be a string")
    texts: tuple[str, ...] | None = None
    token_ids: tuple[np.ndarray, ...] | None = None
    if isinstance(value, list) and value and _all_ints(value):
        token_ids = _token_arrays([value])  # one text as token ids
    elif isinstance(value, list) and value and all(isinstance(x, list) for x in value):
        if not all(value) or not _all_ints(itertools.chain.from_iterable(value)):
            raise _input_error(value)
        _count(len(value), "input", limits)
        token_ids = _token_arrays(value)
    elif isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(t, str) for t in value)):
        texts = _texts(value, "input", limits)
    else:
        raise _input_error(value)
    return EmbeddingsRequest(texts=texts, token_ids=token_ids, model=model,
                             dimensions=_int(body, "dimensions", None, 1),
                             encoding_format=_choice(body, "encoding_format", "float", ENCODINGS),
                             input_type=_choice(body, "input_type", "query", SIDES),
                             truncate=_bool(body, "truncate"))


def parse_search(body: dict[str, Any], limits: Limits) -> SearchRequest:
    _unknown(body, ("query", "queries", "vectors", "k", "nprobe", "rescore", "include", "truncate", "where"))
    given = [name for name in ("query", "queries", "vectors") if body.get(name) is not None]
    if len(given) != 1:
        raise RequestError(422, "give exactly one of 'query' (a text), 'queries' (texts) or 'vectors'"
                           + (f" (got {', '.join(given)})" if given else ""))
    texts: tuple[str, ...] | None = None
    vectors: np.ndarray | None = None
    if given[0] == "query":
        if not isinstance(body["query"], str):
            raise RequestError(422, "'query' must be a string (use 'queries' for a list)")
        texts = _texts(body["query"], "query", limits)
    elif given[0] == "queries":
        if not isinstance(body["queries"], list):
            raise RequestError(422, "'queries' must be a list of strings")
        texts = _texts(body["queries"], "queries", limits, "a list of strings")  # NOTE: a bare string is refused above
    else:
        vectors = _vectors(body["vectors"], limits)
    include = body.get("include")
    if include is None:
        include = []
    if not isinstance(include, list) or any(not isinstance(x, str) or x not in INCLUDES for x in include):
        raise RequestError(422, f"'include' must be a list of {', '.join(map(repr, INCLUDES))}")
    # NOTE: the default within --max-k too: a server started with --max-k 5 answered 10 hits to a request without k
    k = _int(body, "k", default_k(limits.max_k), 1, limits.max_k, "--max-k")
    assert k is not None
    return SearchRequest(texts=texts, vectors=vectors, k=k,
                         nprobe=_int(body, "nprobe", None, 1, MAX_NPROBE),
                         rescore=_int(body, "rescore", None, 0, MAX_RESCORE),
                         include=tuple(dict.fromkeys(include)), truncate=_bool(body, "truncate"),
                         where=_where(body), field=given[0])


# NOTE: the numbers float32 holds are those below 2**128 - 2**103 in magnitude, halfway between its largest value
# (3.4028234663852886e38) and 2**128: float32 rounds them to a finite value; from there on it rounds to infinity. So
# "3.4028235e38", float32's largest value as numpy, orjson or any shortest float32 writer prints it (a little above it
# as a float64), is that value, not beyond float32
FLOAT32_ROUNDS_TO_INF = 2.0**128 - 2.0**103


_NUMBERS = frozenset((int, float))  # what a JSON number reads as (a bool is no number here)


def _vectors(rows: Any, limits: Limits) -> np.ndarray:
    """Rows of one length, each value a finite number that float32 holds (NaN, Infinity or 1e39 would
    search as NaN: no hits, or FAISS's garbage), as float32 ``[n, dim]``.

    NOTE: checked and converted with C loops (a set of each row's types, one numpy conversion): a value at a time in
    Python cost ~20 ms of the event loop for 256 rows of 384."""
    ok = isinstance(rows, list) and all(_vector_row(r) for r in rows)
    if not ok:
        raise RequestError(422, f"'vectors' must be a list of non-empty lists of numbers: {_vectors_where(rows)}")
    _count(len(rows), "vectors", limits)
    lengths = {len(r) for r in rows}
    if len(lengths) > 1:
        raise RequestError(422, f"'vectors' rows must all have the same length, got {sorted(lengths)[:4]}")
    try:
        values = np.array(rows, dtype=np.float64)
        finite = (np.abs(values) < FLOAT32_ROUNDS_TO_INF).all(axis=1)  # NOTE: False for NaN too
    except OverflowError:  # an integer beyond any float
        finite = np.array([_float_row(row) for row in rows])
    if not finite.all():
        raise RequestError(422, f"'vectors' row {int(np.argmin(finite))} holds a value that is not a finite float32 "
                                "number (NaN, Infinity or beyond 3.4e38)")
    return values.astype(np.float32)


def _vector_row(row: Any) -> bool:
    return isinstance(row, list) and bool(row) and set(map(type, row)) <= _NUMBERS


def _vectors_where(rows: Any) -> str:
    """Where ``rows`` (refused by ``_vectors``) is not a list of non-empty lists of numbers."""
    if not isinstance(rows, list):
        return f"it is {_kind(rows)}"
    i = _first(rows, _vector_row)
    row = rows[i]
    if not isinstance(row, list):
        hint = " (one vector is sent as [[...]])" if type(row) in _NUMBERS else ""
        return f"row {i} is {_kind(row)}{hint}"
    if not row:
        return f"row {i} is an empty list"
    j = _first(row, lambda v: type(v) in _NUMBERS)
    return f"row {i} position {j} is {_kind(row[j])}"


def _float_row(row: list[int | float]) -> bool:
    """Whether every value of ``row`` is a float32 number (an integer beyond any float is not)."""
    try:
        return bool((np.abs(np.array(row, dtype=np.float64)) < FLOAT32_ROUNDS_TO_INF).all())
    except OverflowError:
        return False


def _where(body: dict[str, Any]) -> str | None:
    where = body.get("where")
    if where is not None and (not isinstance(where, str) or not where.strip()):
        raise RequestError(422, "'where' must be a filter expression, e.g. \"lang = 'en'\"")
    return where
