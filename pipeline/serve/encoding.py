"""JSON in and out of the server, cheap: orjson when it is installed (the ``serve`` extra), the standard
library otherwise, with the same results.

The embedding response is the hot one (1024 floats as JSON text per text). With orjson the float32 rows
are written straight from numpy (the shortest text that reads back as the same float32); without it,
``%.9g`` (nine significant digits, enough for any float32 to read back exactly) is about 2.5x faster
than ``json.dumps`` of the rows as Python floats. ``base64`` (what the official ``openai`` client asks
for by default) is little-endian float32 bytes, a few microseconds a row either way.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import math
from decimal import Decimal
from typing import Any

import numpy as np

try:  # NOTE: optional: the serve extra installs it; everything here works without it
    import orjson
except ImportError:  # pragma: no cover - depends on the environment
    orjson = None  # type: ignore[assignment]

_ORJSON_OPTIONS = 0 if orjson is None else (orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
                                            | orjson.OPT_PASSTHROUGH_DATETIME)
_FORMATS: dict[int, str] = {}


# NOTE: orjson reads an integer beyond 64 bits as a float (2**64 -> 1.8e19): a body that may hold an integer of 19
# digits or more goes to the stdlib. A JSON number starts the body or follows '[', ',', ':' or whitespace: mapped to
# '[' (and every digit to '0'), such an integer is '[' + 19 zeros, or '[-' + 19 zeros; a fraction's or an exponent's
# digits follow '.', 'e' or a sign after it, never '['. (Digits in a string after such a character also send the body
# to the stdlib: it reads the same.) NOTE: the regex rb"\d{19}" that did this cost ~45 ms of the event loop for 1.2 MB
# of vectors, and matched the fraction of any full-precision float in [1e-4, 1e-3) ('0.00012345678901234567'), as
# nearly every body of real vectors holds: all of them were read by the stdlib, 3-4x slower than orjson
_NUMBER_STARTS = bytes.maketrans(b"123456789,: \t\n\r", b"000000000[[[[[[")
_LONG_DIGITS = b"0" * 19


def _long_integer(body: bytes) -> bool:
    """Whether ``body`` may hold an integer of 19 digits or more (a few ms for MBs: two C searches)."""
    mapped = b"[" + body.translate(_NUMBER_STARTS)
    return b"[" + _LONG_DIGITS in mapped or b"[-" + _LONG_DIGITS in mapped


def loads(body: bytes) -> Any:
    """``json.loads``'s result and errors for a UTF-8 body (RFC 8259; a leading BOM is ignored, UTF-16 is
    not JSON here): orjson first; what it refuses (NaN, a lone surrogate ``\\ud800``) or would read
    differently (an integer over 64 bits) goes to the standard library, which decides. ``RecursionError``
    for nesting too deep, ``ValueError`` for an integer of thousands of digits."""
    if orjson is not None and not _long_integer(body):
        try:
            return orjson.loads(body)
        except (orjson.JSONDecodeError, TypeError):
            pass
    return json.loads(body.decode("utf-8-sig"))


FAST_KEYS = 64  # duplicate_key counts each key in the body up to this many keys (a request has a dozen at most)


def duplicate_key(body: bytes, value: dict[str, Any]) -> str | None:
    """A key that the top-level object ``value`` (parsed from ``body``) has more than once, else ``None``.

    JSON readers keep the last of repeated keys, others (a proxy, a filter in front) the first: a repeated
    field is refused rather than guessed. Cheap (one ``memchr`` and one ``bytes.count`` per key, ~2 ms for
    5 MB of vectors): when the body has no escape at all and each of its few keys shows once as ``"key"``,
    none repeats; otherwise the body is parsed again, keeping every pair (linear in the body: a body of many
    keys, 50,000 unknown fields in 1 MB, cost one scan of the body per key, minutes of the server's CPU).
    """
    if not value:
        return None
    # NOTE: without a backslash no string of the body holds a quote or a control character (JSON escapes
    # them), so a key is written `"` + its UTF-8 + `"`; every occurrence of it is counted, and a match
    # elsewhere (inside a value) only adds: a count of 1 is the key's one occurrence
    if (b"\\" not in body and len(value) <= FAST_KEYS
            and all(body.count(b'"%s"' % key.encode()) == 1 for key in value)):
        return None
    objects: list[list[tuple[str, Any]]] = []

    def keep_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        objects.append(pairs)  # NOTE: innermost first: the top-level object comes last
        return dict(pairs)

    json.loads(body.decode("utf-8-sig"), object_pairs_hook=keep_pairs)
    seen: set[str] = set()
    for key, _ in objects[-1]:
        if key in seen:
            return key
        seen.add(key)
    return None


def iso_duration(value: dt.timedelta) -> str:
    """A duration as ISO 8601 (``P1D``, ``PT1M30S``, ``-PT5S``, ``PT0.0015S``), never Python's ``1 day, 0:00:00`` or
    ``-1 day, 23:59:55`` (that is -5 s)."""
    total_ns = getattr(value, "value", None)  # NOTE: pandas' Timedelta (pyarrow's duration('ns') with pandas) keeps ns
    if not isinstance(total_ns, int):
        total_ns = value // dt.timedelta(microseconds=1) * 1000
    sign, total_ns = ("-" if total_ns < 0 else ""), abs(total_ns)
    days, rest = divmod(total_ns, 86_400 * 10**9)
    hours, rest = divmod(rest, 3_600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    seconds, fraction = divmod(rest, 10**9)
    second_text = f"{seconds}.{fraction:09d}".rstrip("0") if fraction else str(seconds)
    clock = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "") + \
        (f"{second_text}S" if seconds or fraction else "")
    if not days and not clock:
        return "PT0S"
    return f"{sign}P" + (f"{days}D" if days else "") + (f"T{clock}" if clock else "")


def plain_decimal(value: Decimal) -> str:
    """A decimal in positional notation with its scale (``0.000000000``, ``-0.000000100``, ``1545.60``).

    NOTE: ``str()`` writes a small or zero one in scientific notation: a ``decimal128(38, 9)`` zero was ``0E-9``,
    -0.0000001 ``-1.00E-7``."""
    return format(value, "f")


def json_default(value: Any) -> str:
    """A value JSON has no type for (a kept or stored column's date, time, decimal, duration): a duration as ISO
    8601 (``iso_duration``, as ``petal query`` shows it), a decimal positional (``plain_decimal``), anything else as
    ``str()``."""
    if isinstance(value, Decimal):
        return plain_decimal(value)
    return iso_duration(value) if isinstance(value, dt.timedelta) else str(value)


def dumps(body: Any, use_orjson: bool = True) -> bytes:
    """UTF-8 JSON of ``body``; values JSON has no type for (dates, decimals, durations) as ``json_default`` writes
    them."""
    if use_orjson and orjson is not None:
        try:
            return orjson.dumps(body, default=json_default, option=_ORJSON_OPTIONS)
        except (TypeError, orjson.JSONEncodeError):  # an integer over 64 bits, a cycle...: the stdlib decides
            pass
    try:
        # NOTE: allow_nan=False: the standard library writes NaN and Infinity (a metadata column's NaN), which no
        # JSON reader takes; orjson writes null for them, and so does this path
        return json.dumps(body, ensure_ascii=False, default=json_default, allow_nan=False).encode()
    except ValueError:
        body = _finite(body)
    try:
        return json.dumps(body, ensure_ascii=False, default=json_default).encode()
    except UnicodeEncodeError:  # a lone surrogate (a shard's or a request's text): escaped, still valid JSON
        return json.dumps(body, default=json_default).encode()


def _finite(value: Any) -> Any:
    """``value`` with every float that is NaN or infinite (in lists, tuples and dicts) as ``None``, as orjson writes
    it (numpy scalars as their Python values)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _float_rows(rows: np.ndarray) -> list[str]:
    """Each float32 row as JSON array text, exact on reading back as float32 (the no-orjson path)."""
    width = rows.shape[1]
    fmt = _FORMATS.get(width)
    if fmt is None:
        fmt = _FORMATS[width] = "[" + ",".join(["%.9g"] * width) + "]"
    return [fmt % tuple(row) for row in rows.tolist()]


def embeddings_body(model_id: str, rows: np.ndarray, encoding_format: str, prompt_tokens: int,
                    use_orjson: bool = True) -> bytes:
    """The ``/v1/embeddings`` answer (OpenAI's shape) for float32 ``rows`` ``[n, dim]``."""
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    rows = np.ascontiguousarray(rows, dtype="<f4")
    if encoding_format == "base64":
        data: list[Any] = [base64.b64encode(row.tobytes()).decode("ascii") for row in rows]
    elif use_orjson and orjson is not None:
        data = list(rows)
    elif not np.isfinite(rows).all():  # NOTE: %g would write nan/inf, which no JSON reader takes
        data = rows.tolist()
    else:
        head = dumps({"object": "list", "model": model_id}, use_orjson)[:-1]
        items = ",".join(f'{{"object":"embedding","index":{i},"embedding":{text}}}'
                         for i, text in enumerate(_float_rows(rows)))
        return head + b',"data":[' + items.encode() + b'],"usage":' + dumps(usage, use_orjson) + b"}"
    return dumps({"object": "list", "model": model_id,
                  "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
                  "usage": usage}, use_orjson)
