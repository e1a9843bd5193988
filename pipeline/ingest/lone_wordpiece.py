"""A lone plain-ASCII text through a BERT WordPiece tokenizer, in Python with a word cache: the lone-text
(latency) path of tokenization for tokenizers like the packaged MiniLM's.

``tokenizers`` spends most of a lone query's encoding outside the WordPiece lookups: the pre-tokenizer,
offsets and the ``Encoding`` object handed back. The same text split into words here, each word's ids
read from a cache, costs 0.21-0.26x the tokenizer's own encoding (``python bench/lone_request_probe.py
tokenize``, 2-core CPU: 112 against 527 us at 132 tokens, 28 against 107 us at 20). A text with a word
not cached yet is encoded by the tokenizer itself, and the cache learns each of its words' ids (from the
encoding's ``word_ids``). The steps are the tokenizer's own, for a text of printable ASCII only:

```
normalise      AsciiBertNormalizer (tab/newline/return -> space, lowercase)
pre-tokenize   BertPreTokenizer: split at spaces, every ASCII punctuation character a word of its own
model          WordPiece of each word (cached by word; a text with a miss: the tokenizer's own encoding)
post-process   the template's fixed prefix and suffix ([CLS] ... [SEP]), found by encoding probe words
truncate       the words' ids cut at max_length minus the special tokens, flagged as overflowing
```

It applies only to a tokenizer built from exactly these parts (anything else returns ``None`` from
``for_tokenizer``) and declines (``None``) any text that is not plain ASCII or that contains an added
token's text ("[MASK]", "[SEP]": the tokenizer matches those before normalising; checked without regard
to case, so a near miss also takes the tokenizer). Same ids and flags as the batch path:
``tests/test_parquet.py``.
"""

from __future__ import annotations

import re
from typing import Any

from petal.pipeline.ingest.ascii_normalize import AsciiBertNormalizer

# a BertPreTokenizer word of a printable-ASCII text: one punctuation character, or a run of anything else
# but the space (the four ranges are Rust's char::is_ascii_punctuation, which BertPreTokenizer splits on)
_PUNCTUATION = r"!-/:-@\[-`{-~"
_WORDS = re.compile(f"[{_PUNCTUATION}]|[^ {_PUNCTUATION}]+")
MAX_CACHED_WORDS = 1 << 16  # NOTE: a bound on memory: past it, new words are tokenized but not kept


def added_tokens_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """A case-insensitive pattern of every added token's text (``None`` when there are none)."""
    contents = sorted({t.content for t in tokenizer.get_added_tokens_decoder().values() if t.content}, key=len,
                      reverse=True)
    return re.compile("|".join(map(re.escape, contents)), re.IGNORECASE) if contents else None


def holds_added_token(added: re.Pattern[str] | None, text: str, normalized: str) -> bool:
    """Whether ``text`` holds an added token's text: in the raw text (added tokens matched before
    normalising) or the normalised one (those matched after)."""
    return added is not None and (added.search(text) is not None or added.search(normalized) is not None)


class LoneWordPiece:
    """``__call__(text)`` -> ``(token ids, truncated)``, or ``None`` for a text this path does not take."""

    def __init__(self, tokenizer: Any, normalize: AsciiBertNormalizer, added: re.Pattern[str] | None,
                 prefix: list[int], suffix: list[int], max_content: int) -> None:
        self._encoder = tokenizer  # NOTE: the full tokenizer: it encodes every text with a word not cached yet
        self._normalize = normalize
        self._added = added
        self._prefix = prefix
        self._suffix = suffix
        self._max_content = max_content  # ids of the text's words kept under truncation
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, max_length: int,
                      added: re.Pattern[str] | None = None) -> LoneWordPiece | None:
        """The path for a ``tokenizers.Tokenizer`` (truncating at ``max_length`` tokens, special tokens
        included; no padding) made of BertNormalizer, BertPreTokenizer, WordPiece and a prefix + text + suffix
        template; ``None`` for any other. ``added``: the tokenizer's ``added_tokens_pattern`` when the caller
        has it (made here otherwise)."""
        from tokenizers.models import WordPiece
        from tokenizers.pre_tokenizers import BertPreTokenizer

        normalize = AsciiBertNormalizer.for_tokenizer(tokenizer)
        if normalize is None or not isinstance(tokenizer.pre_tokenizer, BertPreTokenizer) \
                or not isinstance(tokenizer.model, WordPiece) or tokenizer.post_processor is None \
                or tokenizer.padding is not None:
            return None
        specials = tokenizer.post_processor.num_special_tokens_to_add(False)
        affixes = None
        for probe in ("a", "the cat", "x, y."):  # NOTE: the same prefix and suffix around every probe
            content = tokenizer.encode(probe, add_special_tokens=False).ids
            full = tokenizer.encode(probe).ids
            if len(full) != len(content) + specials or len(content) + specials > max_length:
                return None
            starts = [i for i in range(specials + 1) if full[i: i + len(content)] == content]
            if not starts:
                return None
            found = (full[: starts[0]], full[starts[0] + len(content):])
            if affixes is not None and found != affixes:
                return None
            affixes = found
        assert affixes is not None
        pattern = added if added is not None else added_tokens_pattern(tokenizer)
        return cls(tokenizer, normalize, pattern, affixes[0], affixes[1],
                   max_length - specials)

    def __call__(self, text: str) -> tuple[list[int], bool] | None:
        normalized = self._normalize(text)
        if normalized is None or holds_added_token(self._added, text, normalized):
            return None
        words = _WORDS.findall(normalized)
        ids: list[int] = []
        cache, limit = self._cache, self._max_content
        for word in words:
            got = cache.get(word)
            if got is None:  # NOTE: a word not seen yet: the tokenizer encodes the text, the cache learns its words
                return self._learn(text, words)
            ids += got
            if len(ids) > limit:  # NOTE: truncated: the rest of a long text is never split
                return [*self._prefix, *ids[:limit], *self._suffix], True
        return [*self._prefix, *ids, *self._suffix], False

    def _learn(self, text: str, words: list[str]) -> tuple[list[int], bool]:
        """The tokenizer's own encoding of ``text``, whose ids of each word (its ``word_ids``) go into the
        cache: every word when none was cut, all but the last one reached when the text was truncated.
        (One Rust call per text: the model's ``tokenize`` per missing word costs ~14 us a word.)"""
        encoding = self._encoder.encode(text)
        truncated = bool(encoding.overflowing)
        by_word: dict[int, list[int]] = {}
        for token_id, word in zip(encoding.ids, encoding.word_ids):
            if word is not None:
                by_word.setdefault(word, []).append(token_id)
        reached = len(by_word) - 1 if truncated else len(by_word)
        # NOTE: learnt only when the tokenizer's words are ours (the same count, in order); else nothing
        if (len(by_word) == len(words) or (truncated and len(by_word) <= len(words))) \
                and all(i in by_word for i in range(len(by_word))):
            cache = self._cache
            for i in range(reached):
                if len(cache) >= MAX_CACHED_WORDS:
                    break
                cache.setdefault(words[i], by_word[i])
        return encoding.ids, truncated
