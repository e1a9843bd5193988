"""BERT text normalisation of a plain-ASCII text in Python: the lone-text (latency) path of tokenization.

``tokenizers``' ``BertNormalizer`` (``clean_text``, ``lowercase``) costs ~120 us for an 800-character
text in Rust, where it also tracks offsets: more than a third of a lone query's tokenization. For a
text of printable ASCII characters plus tab, newline and carriage return its result is
``text.translate(tab/newline/return -> space)``, then ``.lower()`` when it lowercases: there is no
control character to drop, no CJK character to pad and no accent to strip (``strip_accents`` and
``handle_chinese_chars`` change nothing on ASCII). Any other text (another control character, any
non-ASCII character) returns ``None`` and goes through the tokenizer's own normaliser.

Only lone texts take this path: a batch is encoded on the tokenizer's Rust threads with the GIL
released, where Python work per text would hold it (the pipeline's tokenize workers share the GIL
with the engine thread).
"""

from __future__ import annotations

from typing import Any

_WHITESPACE = str.maketrans({"\t": " ", "\n": " ", "\r": " "})


class AsciiBertNormalizer:
    """``__call__(text)``: the normalised text, or ``None`` when ``text`` is not plain ASCII."""

    def __init__(self, lowercase: bool) -> None:
        self.lowercase = lowercase

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> AsciiBertNormalizer | None:
        """The fast path for a ``tokenizers.Tokenizer`` whose normaliser is a ``BertNormalizer`` that cleans
        text (``None`` for any other normaliser, a sequence of them included)."""
        from tokenizers.normalizers import BertNormalizer

        normalizer = tokenizer.normalizer
        if not isinstance(normalizer, BertNormalizer) or not normalizer.clean_text:
            return None
        return cls(bool(normalizer.lowercase))

    def __call__(self, text: str) -> str | None:
        if not text.isascii():
            return None
        spaced = text.translate(_WHITESPACE)
        if not spaced.isprintable():  # NOTE: a control character left: the Rust normaliser drops it
            return None
        return spaced.lower() if self.lowercase else spaced
