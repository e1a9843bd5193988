"""One rule for every text petal embeds (``petal index`` rows, ``petal embed`` inputs, ``petal query``
queries): null, undecodable or invisible text (empty, whitespace, control or zero-width characters
only) is skipped and counted by reason, never embedded and never a failure on its own.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from petal.pipeline.ingest.documents import VISIBLE, _undecodable


def skip_reason(text: Any) -> str | None:
    """``None`` for a text to embed, else why it is skipped (the reasons of ``petal index``'s rejects)."""
    if text is None:
        return "null_text"
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return _undecodable(text)
    if not isinstance(text, str):
        return "not_text"
    return "empty_text" if VISIBLE.search(text) is None else None


def describe_skips(skipped: dict[int, str], limit: int = 5) -> str:
    """``"2 skipped (empty_text 1, null_text 1; inputs 3, 7)"`` for ``{input position: reason}``."""
    if not skipped:
        return "0 skipped"
    counts = ", ".join(f"{why} {n}" for why, n in sorted(Counter(skipped.values()).items()))
    positions = sorted(skipped)
    shown = ", ".join(map(str, positions[:limit])) + (" ..." if len(positions) > limit else "")
    return f"{len(skipped)} skipped ({counts}; inputs {shown})"
