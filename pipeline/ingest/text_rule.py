"""One rule for every text petal embeds (``petal index`` rows, ``petal embed`` inputs, ``petal query``
queries): null, undecodable or invisible text (empty, whitespace, control or zero-width characters
only) is skipped and counted by reason, never embedded and never a failure on its own.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

# NOTE: no pyarrow here (``petal embed`` and ``petal query`` apply the rule): ``documents.py`` imports from this.
# A character a reader can see: not whitespace, not a C0/C1 control, and not one of Unicode's
# Default_Ignorable_Code_Point characters (DerivedCoreProperties.txt: zero-width and bidi marks, the soft hyphen,
# variation selectors, tag characters, Hangul fillers, ...), which render as nothing.
# NOTE: a text of only those is no text: MiniLM's tokenizer drops or [UNK]s them, so every such row got one and the same
# [CLS] [SEP] vector, which outranked real documents for any query.
VISIBLE = re.compile(r"[^\s\x00-\x1f\x7f-\x9f\xad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f"
                     r"\u2028-\u202f\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3"
                     r"\U0001d173-\U0001d17a\U000e0000-\U000e0fff]")
# NOTE: what Notepad, PowerShell's Out-File and Excel's "CSV UTF-8" write before the first line of a text file: it
# marks the encoding and is no part of the first text (a .jsonl line starting with it is no JSON to json.loads)
UTF8_BOM = b"\xef\xbb\xbf"


def input_lines(lines: Iterable[bytes], starts_input: bool = True) -> Iterator[bytes]:
    """``--stdin``'s lines as they arrive (``petal query``, ``petal embed``): the line end (``\\n``, ``\\r\\n``)
    dropped, and a UTF-8 byte order mark that starts the input (``UTF8_BOM``; ``starts_input``: ``lines`` are the
    first of the input).

    NOTE: one ``\\n`` and one ``\\r`` before it, as a ``.txt`` input's lines (``texts.py``): ``rstrip`` dropped every
    ``\\r`` at a line's end, so ``b"x\\r\\r\\n"`` was the query ``"x"`` on stdin and ``"x\\r"`` from a file."""
    first = starts_input
    for raw in lines:
        if first:
            raw, first = raw.removeprefix(UTF8_BOM), False
        line = raw.removesuffix(b"\n")
        yield line.removesuffix(b"\r")


def undecodable_reason(text: bytes) -> str:
    """``lone_surrogate`` for UTF-8-encoded surrogate halves (CESU-8, WTF-8), else ``invalid_utf8``."""
    try:
        text.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return "invalid_utf8"
    return "lone_surrogate"


def undecodable_text_reason(text: object) -> str | None:
    """Why a ``str`` that is not valid Unicode is not embedded, else ``None``: it holds surrogate code points, the
    bytes that were not UTF-8 as Python keeps them from argv, stdin and files read with ``surrogateescape``
    (``invalid_utf8``, or ``lone_surrogate`` for UTF-8-encoded surrogate halves), or lone surrogates of its own
    (``"\\ud800"``: ``lone_surrogate``). The reasons of ``petal index``'s rejects, whose bytes arrive as bytes."""
    if not isinstance(text, str):
        return None
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError:
        pass
    try:
        return undecodable_reason(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # a surrogate that stands for no byte
        return "lone_surrogate"


def utf8_or_bytes(raw: bytes) -> str | bytes:
    """A line of input as text, or its bytes when they are not UTF-8 (the text rule skips those, by reason)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def skip_reason(text: Any) -> str | None:
    """``None`` for a text to embed, else why it is skipped (the reasons of ``petal index``'s rejects)."""
    if text is None:
        return "null_text"
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return undecodable_reason(text)
    if not isinstance(text, str):
        return "not_text"
    return "empty_text" if VISIBLE.search(text) is None else None


def describe_skips(skipped: dict[int, str], limit: int = 5) -> str:
    """``"2 skipped (empty_text 1, null_text 1; at inputs 3, 7)"`` for ``{input position: reason}`` (0-based, as the
    caller's list indexes them). NOTE: was "...; inputs 0)", read as a count of no inputs."""
    if not skipped:
        return "0 skipped"
    counts = ", ".join(f"{why} {n}" for why, n in sorted(Counter(skipped.values()).items()))
    positions = sorted(skipped)
    shown = ", ".join(map(str, positions[:limit])) + (" ..." if len(positions) > limit else "")
    return f"{len(skipped)} skipped ({counts}; at input{'s' if len(positions) > 1 else ''} {shown})"


_SURROGATE = re.compile("[\ud800-\udfff]")


def first_surrogate(text: str) -> int | None:
    """Where ``text`` holds its first surrogate code point (``None``: nowhere): a command-line byte that is not
    UTF-8, read by surrogateescape, or JSON's ``"\\ud800"``. No Parquet column name nor stored string holds one, and
    Arrow cannot encode it (a raw ``UnicodeEncodeError``)."""
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


def decoded_json_text(text: str) -> str:
    """A text read from JSON as valid Unicode: each lone surrogate (``"\\ud800"``, a code point, not a byte)
    becomes one U+FFFD. (``valid_text`` is for argv and stdin, where a surrogate stands for a byte.)"""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)


def valid_text(text: str) -> tuple[str, bool]:
    """``text`` as valid Unicode: bytes that were not UTF-8 (lone surrogates, as Python decodes argv and
    stdin) become U+FFFD. Returns the text and whether anything was replaced."""
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")  # one U+FFFD per undecodable byte
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "replace"), True
