"""Filtered search: ``--where "lang = 'en' AND year IN (2020, 2021)"`` on the kept columns, applied inside
FAISS search through an id selector (a bitmap over FAISS ids), so the top k are the top k of the
matching documents, not what is left of the top k after filtering.

Grammar: ``clause (AND clause)*``; a clause is ``column = literal`` or ``column IN (literal, ...)``;
a literal is a single-quoted string (``''`` for a quote), a number, ``true`` or ``false``. Names are columns
given to ``petal index --keep-columns``: bare (letters of any script, digits, ``_`` and ``.``, not starting with a
digit) or double-quoted (``""`` for a quote); a literal compares only with a column of its own kind
(``filter_values.py``: ``topic = 5`` on a string column is an error, never a cast).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from petal.pipeline.ingest.text_rule import first_surrogate

if TYPE_CHECKING:  # NOTE: parsing is light (petal query checks --where before anything heavy loads)
    import numpy as np
    import pyarrow as pa

TOKEN_RE = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)|"
                      r"(?P<name>[^\W\d][\w.]*|\"(?:[^\"]|\"\")+\")|(?P<bad>==|!=|<>|<=|>=|[<>!])|(?P<op>[=(),]))")
# NOTE: what a reader of SQL may write that the grammar has not: named, with the forms it has (was: ``expected =, got
# 's'`` for ``NOT s = 'en'``, and a hint to double-quote the column for ``s != 'en'``)
FORMS = ("a filter is clauses joined by AND, each \"col = 'x'\" or \"col IN ('a', 'b')\" (no OR, NOT, IS NULL, LIKE, "
         "BETWEEN, !=, <, >)")
UNSUPPORTED = {"OR": "OR", "NOT": "NOT", "IS": "IS NULL", "NULL": "NULL", "LIKE": "LIKE", "BETWEEN": "BETWEEN"}


# NOTE: a kept column may be named anything; the grammar's bare names are these only
QUOTED_NAMES = ('a column named otherwise than letters, digits, _ and . (starting with a letter or _; or named AND, '
                'IN, true, false) is written in double quotes: "my-col" = 1, with "" for a double quote in it: '
                '"q""x" = 1')


class FilterError(ValueError):
    """A ``where`` filter the index cannot apply, named: it does not parse, names a column the index does not keep,
    compares a column with a literal of another kind (``filter_values.py``), or the index cannot filter at all. The
    user's or client's mistake (``petal query --where``: exit 2; ``petal serve``'s ``where``: 422), where any other
    ``ValueError`` raised by a search is petal's own (exit 1, 500). A ``ValueError``, as these always were."""


@dataclass(frozen=True)
class Clause:
    column: str
    values: tuple[Any, ...]  # one value: equality; several: IN


@dataclass(frozen=True)
class Filter:
    """A parsed ``--where``: every clause must hold."""

    text: str
    clauses: tuple[Clause, ...]

    @property
    def columns(self) -> list[str]:
        return sorted({c.column for c in self.clauses})


def _tokens(text: str) -> list[tuple[str, Any, str]]:
    """``(kind, value, as written)`` of each token of ``text``: ``lit``, ``name``, ``kw`` (AND, IN) or ``op``."""
    tokens: list[tuple[str, Any, str]] = []
    pos = 0
    end = len(text.rstrip())  # NOTE: once, not the rest of the text stripped at every token (quadratic: a 1 MB
    while pos < end:  # filter held petal serve's search thread for 15 s)
        match = TOKEN_RE.match(text, pos)
        if match is None:
            raise FilterError(_unreadable(text, pos, bool(tokens) and tokens[-1][0] == "lit"))
        kind = match.lastgroup
        value = match.group(kind)  # type: ignore[arg-type]  # every alternative of TOKEN_RE is a named group
        if kind == "bad":
            raise FilterError(f"--where {text!r}: {value!r} (at character {match.start(kind) + 1}) is no operator "
                              f"of the filter, whose operators are = and IN; {FORMS}")
        pos = match.end()
        # NOTE: keywords and literals are ASCII words: "ın".upper() is "IN", "falſe".upper() "FALSE"
        word = value.upper() if value.isascii() else value
        if kind == "str":
            tokens.append(("lit", value[1:-1].replace("''", "'"), value))
        elif kind == "num":
            tokens.append(("lit", _number(text, value), value))
        elif kind == "name" and value.startswith('"'):
            tokens.append(("name", value[1:-1].replace('""', '"'), value))
        elif kind == "name":
            if word in ("TRUE", "FALSE"):  # NOTE: unquoted only: "true" is a column so named
                tokens.append(("lit", word == "TRUE", value))
            else:
                tokens.append(("kw", word, value) if word in ("AND", "IN") else ("name", value, value))
        else:
            tokens.append(("op", value, value))
    return tokens


def _unreadable(text: str, pos: int, after_number: bool) -> str:
    """Why ``text`` cannot be read at ``pos``: a string or name left open, a number written otherwise than the
    grammar's (``.5``, ``5.``, ``+5``), or a name that must be double-quoted."""
    rest = text[pos:].strip()
    said = f"--where {text!r}: cannot read {rest[:20]!r} (at character {len(text) - len(text[pos:].lstrip()) + 1})"
    if rest[:1] in ("'", '"'):
        return said
    if re.match(r"[-+]?\.?\d", rest) or (after_number and rest[:1] == "."):
        return f"{said}: a number is written with a digit on each side of its point and no +: 5, -5, 0.5, 5.0, 5e-3"
    return f"{said}; {QUOTED_NAMES}"


class ExactNumber(float):
    """A number literal with a decimal point or exponent: a float (its kind, ``literal_kind``) and its exact digits
    (``exact``), with which integer, decimal and float columns compare it (``filter_values._numbers``). NOTE:
    through float64 alone, ``big = 4611686018427387904.5`` matched 2^62 and ``dec = 2.5000000000000001`` 2.50."""

    exact: Decimal
    text: str

    def __new__(cls, text: str) -> ExactNumber:
        number = super().__new__(cls, text)
        try:
            number.exact = Decimal(text)
        except InvalidOperation:  # NOTE: an exponent past what Decimal holds (1e999999999999999999999): equals none
            number.exact = Decimal("NaN")
        number.text = text
        return number

    def __repr__(self) -> str:
        return self.text


def _number(text: str, value: str) -> int | float:
    """A number literal of ``text``; an integer of more digits than Python converts (4300: the largest a column holds,
    decimal256, has 76) is a ``FilterError`` naming the filter, not Python's bare message about
    ``sys.set_int_max_str_digits``."""
    if any(c in value for c in ".eE"):
        return ExactNumber(value)
    try:
        return int(value)
    except ValueError:
        digits = len(value.lstrip("-"))
        raise FilterError(f"--where {text[:80]!r}{'...' if len(text) > 80 else ''}: the number {value[:12]}... has "
                          f"{digits} digits, more than any column's value") from None


def parse_filter(text: str) -> Filter:
    """``FilterError`` naming what is wrong in ``text``."""
    bad = first_surrogate(text)  # NOTE: no stored value nor column name holds one, and Arrow cannot encode it
    if bad is not None:
        raise FilterError(f"--where {text!r}: character {bad + 1} is not text (a byte that is not UTF-8, or a lone "
                          "surrogate)")
    tokens = _tokens(text)
    clauses, i = [], 0

    def expect(kind: str, value: Any = None) -> Any:
        nonlocal i
        if i >= len(tokens) or tokens[i][0] != kind or (value is not None and tokens[i][1] != value):
            raise FilterError(_unexpected(text, tokens, i, kind, value))
        i += 1
        return tokens[i - 1][1]

    while True:
        column = expect("name")
        if i < len(tokens) and tokens[i][:2] == ("kw", "IN"):
            i += 1
            expect("op", "(")
            values = [expect("lit")]
            while i < len(tokens) and tokens[i][:2] == ("op", ","):
                i += 1
                values.append(expect("lit"))
            expect("op", ")")
        else:
            expect("op", "=")
            values = [expect("lit")]
        clauses.append(Clause(column, tuple(values)))
        if i == len(tokens):
            break
        expect("kw", "AND")
    return Filter(text, tuple(clauses))


def _unexpected(text: str, tokens: list[tuple[str, Any, str]], i: int, kind: str, value: Any) -> str:
    """The error of ``tokens[i]`` where ``kind`` (of ``value``) belongs: an unsupported word of SQL (it, or the column
    before it: ``NOT s = 'en'``) named, a keyword or number where a column belongs with the double quotes' hint."""
    near = [t for t in tokens[max(i - 1, 0):i + 1] if t[0] == "name" and not t[2].startswith('"')]
    word = next((UNSUPPORTED[t[2].upper()] for t in reversed(near)
                 if t[2].isascii() and t[2].upper() in UNSUPPORTED), None)
    if word is not None:
        return f"--where {text!r}: {word} is not supported; {FORMS}"
    got = "the end" if i >= len(tokens) else tokens[i][2] if tokens[i][0] == "lit" else repr(tokens[i][1])
    want = value if value is not None else {"lit": "a 'string' or a number (or true, false)", "name": "a column"}[kind]
    misplaced = kind == "name" and i < len(tokens) and tokens[i][0] in ("kw", "lit")  # AND, IN, true, 5: not a name
    return f"--where {text!r}: expected {want}, got {got}; the form is \"col = 'x' AND col IN ('a', 'b')\"" + \
        (f"; {QUOTED_NAMES}" if misplaced else "")


def columns_problem(flt: Filter, kept: tuple[str, ...] | list[str], stored: bool, binary: bool) -> str | None:
    """Why ``flt`` cannot filter an index, judged from its manifest alone (``None`` when it can): a binary index,
    a column not kept (``stored``: the index stores columns beside its ids at all)."""
    if binary:
        return ("--where: binary indexes cannot filter yet; build without --quantize binary (and without a binary "
                "--index-factory: BFlat, BIVF...)")
    missing = [c for c in flt.columns if c not in kept]
    if missing or not stored:
        return (f"--where: unknown column {(missing or flt.columns)[0]!r}; filterable columns "
                f"(petal index --keep-columns): {', '.join(kept) or 'none'}")
    return None


def filter_mask(flt: Filter, table: pa.Table, available: list[str]) -> np.ndarray:
    """``[num_rows]`` bool: rows of ``table`` (the version's stored columns, FAISS id order) that match."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from petal.pipeline.index.filter_values import from_python, value_set

    mask = np.ones(table.num_rows, dtype=bool)
    for clause in flt.clauses:
        if clause.column not in available:
            raise FilterError(f"--where: unknown column {clause.column!r}; filterable columns (petal index "
                              f"--keep-columns): {', '.join(available) or 'none'}")
        column = table.column(clause.column)
        values = value_set(clause.column, column.type, clause.values)  # FilterError: a literal of another kind
        wide = compared_type(column.type)
        if pa.types.is_dictionary(column.type):  # NOTE: its values first: Arrow has no take to decode views with
            column = column.cast(pa.dictionary(column.type.index_type, wide)).cast(wide)
        if wide != column.type:
            column = column.cast(wide)
        if wide != values.type:
            values = values.cast(wide)
        if pa.types.is_floating(wide):
            # NOTE: is_in matches by hash, bit for bit: -0.0 was not 0.0 (f = 0 missed a row holding -0.0, f = -0.0 one
            # holding 0.0), where every comparison of numbers finds them equal; x + 0.0 is +0.0 for either zero
            zero = from_python([0.0], wide)[0]  # NOTE: not pa.scalar, which imports pandas (from_python)
            column, values = pc.add(column, zero), pc.add(values, zero)
        mask &= true_rows(pc.is_in(column, value_set=values))
    return mask


def compared_type(dtype: pa.DataType) -> pa.DataType:
    """The type a kept column of ``dtype`` is compared as: its own, or where Arrow has no ``is_in`` kernel for it, one
    that holds each of its values exactly and has one (float16: float32; decimal32 and decimal64: decimal128 of the
    same precision and scale; a view layout: its large one; a dictionary: its values'). Only the comparison widens:
    a hit's field is the stored value, of the stored type.

    NOTE: Arrow 26 has no ``is_in`` for float16, decimal32, decimal64, string_view, binary_view nor any dictionary:
    ``price = 1.5`` on a decimal32 column (a Parquet file's ``DECIMAL(5, 2)`` as pyarrow writes it) was a traceback,
    exit 1 (``petal serve``: 500). ``tests/test_filter_narrow_types.py`` filters every type ``column_kind`` takes."""
    import pyarrow as pa

    t = pa.types
    if t.is_dictionary(dtype):
        return compared_type(dtype.value_type)
    if t.is_float16(dtype):
        return pa.float32()
    if t.is_decimal32(dtype) or t.is_decimal64(dtype):
        return pa.decimal128(dtype.precision, dtype.scale)
    return {pa.string_view(): pa.large_string(), pa.binary_view(): pa.large_binary()}.get(dtype, dtype)


def true_rows(flags: pa.ChunkedArray) -> np.ndarray:
    """``[len(flags)]`` bool: the rows of a boolean column that are true (null: false), read from its bitmaps.
    NOTE: not ``to_numpy``, which imports pandas where it is installed (``filter_values.from_python``)."""
    import numpy as np

    parts = [np.zeros(0, dtype=bool)]
    for chunk in flags.chunks:
        validity, values = chunk.buffers()[:2]
        start, stop = chunk.offset, chunk.offset + len(chunk)
        bits = np.unpackbits(np.frombuffer(values, np.uint8), count=stop, bitorder="little")[start:].astype(bool)
        if validity is not None and chunk.null_count:
            bits &= np.unpackbits(np.frombuffer(validity, np.uint8), count=stop, bitorder="little")[start:].astype(bool)
        parts.append(bits)
    return np.concatenate(parts)


class IdSelector:
    """A FAISS id selector over a bitmap of FAISS ids (kept alive with the selector)."""

    def __init__(self, mask: np.ndarray) -> None:
        import faiss
        import numpy as np

        self.count = int(mask.sum())
        self.bits = np.packbits(mask.astype(np.uint8), bitorder="little")
        # NOTE: FAISS bounds an id by its byte, ``id >> 3 < n`` (1.15: not ``id < n`` as its docstring says): n is the
        # bitmap's bytes. The vectors' count let an id past them (a damaged index body) read up to 7/8 of it beyond
        # this array, out of bounds; an id past the bytes is no member, the padding bits are 0
        self.selector = faiss.IDSelectorBitmap(len(self.bits), faiss.swig_ptr(self.bits))

    def member(self, ids: np.ndarray) -> np.ndarray:
        """``[n]`` bool: which FAISS ``ids`` (int64, none negative) the filter matches."""
        import numpy as np

        inside = (ids >> 3) < len(self.bits)
        out = np.zeros(len(ids), dtype=bool)
        out[inside] = (self.bits[ids[inside] >> 3] >> (ids[inside] & 7)) & 1 == 1
        return out

    def params(self, index: Any, search_params: dict[str, int]) -> Any:
        """Search parameters carrying the selector (``search_parameters``)."""
        return search_parameters(index, search_params, self.selector)


def search_parameters(index: Any, search_params: dict[str, int], selector: Any = None) -> Any:
    """FAISS search parameters for ``index`` (IVF: with its nprobe; HNSW, through id maps and pre-transforms: with
    its efSearch; a refine wrapper: its k_factor around its base index's), carrying ``selector`` (a FAISS id selector)
    when there is one."""
    import faiss

    from petal.pipeline.index.plan import searched_nodes

    sel = {} if selector is None else {"sel": selector}
    nodes = searched_nodes(index)
    refine = next((n for n in nodes if isinstance(n, faiss.IndexRefine)), None)
    if refine is not None:  # NOTE: FAISS's refine search takes only its own parameters, the base's inside them
        base = search_parameters(refine.base_index, search_params, selector)
        params = faiss.IndexRefineSearchParameters(  # type: ignore[call-arg]  # SWIG stubs: no kwargs
            k_factor=float(search_params.get("k_factor_rf", refine.k_factor)), base_index_params=base)
        params.referenced_objects = [base]  # type: ignore[attr-defined]  # NOTE: FAISS holds a bare pointer
        return params
    ivf = faiss.try_extract_index_ivf(index)  # NOTE: through wrappers (OPQ): they pass parameters on
    if ivf is not None:
        probing = faiss.SearchParametersIVF(nprobe=int(search_params.get("nprobe", ivf.nprobe)),  # type: ignore[call-arg]
                                            **sel)
        quantizer = faiss.downcast_index(ivf.quantizer)
        if "quantizer_efSearch" in search_params and isinstance(quantizer, faiss.IndexHNSW):
            # NOTE: the quantizer's own efSearch was set when the index opened; these parameters carry the one asked
            inner = faiss.SearchParametersHNSW(efSearch=int(search_params["quantizer_efSearch"]))  # type: ignore[attr-defined]
            probing.quantizer_params = inner
            probing.referenced_objects = [inner]  # type: ignore[attr-defined]  # NOTE: FAISS holds a bare pointer
        return probing
    hnsw = next((n for n in nodes if isinstance(n, faiss.IndexHNSW)), None)  # NOTE: id maps pass parameters on
    if hnsw is not None:
        return faiss.SearchParametersHNSW(  # type: ignore[attr-defined]  # not in the stubs
            efSearch=int(search_params.get("efSearch", hnsw.hnsw.efSearch)), **sel)
    return faiss.SearchParameters(**sel)
