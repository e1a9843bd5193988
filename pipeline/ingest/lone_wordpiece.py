"""A lone plain-ASCII text through a BERT WordPiece tokenizer, in Python with a word cache: the lone-text
(latency) path of tokenization for tokenizers like the packaged MiniLM's.

``tokenizers`` spends most of a lone query's encoding outside the WordPiece lookups: the pre-tokenizer,
offsets and the ``Encoding`` object handed back. The same text split into words here, each word's ids
read from a cache, costs 0.21-0.26x the tokenizer's own encoding (``python bench/lone_request_probe.py
tokenize``, 2-core CPU: 112 against 527 us at 132 tokens, 28 against 107 us at 20). A word not cached yet
is split here too (``WordPieceSplit``), by WordPiece's greedy longest-match-first over the model's
vocabulary (a few dict lookups; a call into the tokenizer's model costs ~14 us a word), and cached: a
132-token text with no word cached 246 -> 96 us (20 tokens: 40 -> 18 us). The split reads the vocabulary
(~20 ms) at the second text with a word not cached (or at ``prepare()``: a server's warm-up); the first
text's words are learnt from the tokenizer's own encoding (its ``word_ids``), so a one-shot process never
reads it. The steps are the tokenizer's own, for a text of printable ASCII only:

```
normalise      AsciiBertNormalizer (tab/newline/return -> space, lowercase)
pre-tokenize   BertPreTokenizer: split at spaces, every ASCII punctuation character a word of its own
model          WordPiece of each word: its ids from the cache, or split here (the longest vocabulary entry
               from the start, then "##" + the longest from there, ...; a word longer than the model's
               max_input_chars_per_word, or one with a rest no entry starts, is the unknown token)
post-process   the template's fixed prefix and suffix ([CLS] ... [SEP]), found by encoding probe words
truncate       the words' ids cut at max_length minus the special tokens, flagged as overflowing
```

It applies only to a tokenizer built from exactly these parts (anything else returns ``None`` from
``for_tokenizer``) and declines (``None``) any text that is not plain ASCII or that contains an added
token's text ("[MASK]", "[SEP]": the tokenizer matches those before normalising; checked without regard
to case, so a near miss also takes the tokenizer), or whose split would take more lookups than its budget
(``LOOKUPS_PER_CHAR``). ``WordPieceSplit.for_tokenizer`` checks the split against the model's own
``tokenize`` on probe words (pieces, unknown words, an over-long word) and is not used on any difference.
Same ids and flags as the batch path over random texts: ``tests/test_parquet.py``.
"""

from __future__ import annotations

import re
from typing import Any

from petal.pipeline.ingest.ascii_normalize import AsciiBertNormalizer

# a BertPreTokenizer word of a printable-ASCII text: one punctuation character, or a run of anything else
# but the space (the four ranges are Rust's char::is_ascii_punctuation, which BertPreTokenizer splits on)
_PUNCTUATION = r"!-/:-@\[-`{-~"
_WORDS = re.compile(f"[{_PUNCTUATION}]|[^ {_PUNCTUATION}]+")
MAX_CACHED_WORDS = 1 << 16  # NOTE: a bound on memory: past it, new words are split but not kept
# NOTE: a bound on the Python split's work: English prose with no word cached takes ~0.2 lookups a character;
# a text that needs more than this (long words of rare pieces, made to be slow) is left to the tokenizer's
# Rust encoding
LOOKUPS_PER_CHAR = 2
LOOKUPS_PER_TEXT = 256  # and this many on top (a short text with one rare word keeps the Python path)
# words that take every branch of the split: whole words, "##" pieces, unknown pieces, an over-long word
_SPLIT_PROBES = ("unaffable", "tokenization", "playing", "xqzj", "zzzqqq", "14159", "ing", "q" * 101, "ab" * 50,
                 "inrecostinrecostre", "qxzjvkwqxzjvkw", "a", "#")


def added_tokens_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """A case-insensitive pattern of every added token's text (``None`` when there are none)."""
    contents = sorted({t.content for t in tokenizer.get_added_tokens_decoder().values() if t.content}, key=len,
                      reverse=True)
    return re.compile("|".join(map(re.escape, contents)), re.IGNORECASE) if contents else None


def holds_added_token(added: re.Pattern[str] | None, text: str, normalized: str) -> bool:
    """Whether ``text`` holds an added token's text: in the raw text (added tokens matched before
    normalising) or the normalised one (those matched after)."""
    return added is not None and (added.search(text) is not None or added.search(normalized) is not None)


class WordPieceSplit:
    """``__call__(word, budget)``: WordPiece's ids of one word, split here over the model's vocabulary
    (``for_tokenizer``: ``None`` where the split would differ from the model's own)."""

    def __init__(self, vocab: dict[str, int], unk: int, continuing: str, max_word_chars: int) -> None:
        self._vocab = vocab
        self._unk = [unk]
        self._continuing = continuing
        self._max_word_chars = max_word_chars
        # the longest entry that starts with each two characters, for a word's first piece and for the pieces
        # after it (without the prefix): no longer slice is looked up (a rest whose two characters start no
        # entry reads one lookup, a one-character piece), so a long word of rare pieces stays cheap
        self._reach_first: dict[str, int] = {}
        self._reach_next: dict[str, int] = {}
        for entry in vocab:
            reach, piece = ((self._reach_next, entry[len(continuing):])
                            if continuing and entry.startswith(continuing) else (self._reach_first, entry))
            if len(piece) >= 2:
                reach[piece[:2]] = max(reach.get(piece[:2], 0), len(piece))
        if not continuing:  # NOTE: no prefix: a later piece is looked up as any entry is
            self._reach_next = self._reach_first

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> WordPieceSplit | None:
        """The split of a ``tokenizers.Tokenizer``'s WordPiece model (``None``: its unknown token is not in its
        vocabulary, or a probe word splits otherwise than the model's own ``tokenize``)."""
        model = tokenizer.model
        vocab: dict[str, int] = tokenizer.get_vocab(with_added_tokens=False)
        if model.unk_token not in vocab:
            return None
        split = cls(vocab, vocab[model.unk_token], str(model.continuing_subword_prefix),
                    int(model.max_input_chars_per_word))
        for word in _SPLIT_PROBES:  # NOTE: the split here must be the model's own, or the path does not use it
            if split(word, 1 << 30)[0] != [token.id for token in model.tokenize(word)]:
                return None
        return split

    def __call__(self, word: str, budget: int) -> tuple[list[int] | None, int]:
        """WordPiece's ids of ``word`` and the vocabulary lookups they took: greedy longest-match-first over
        the vocabulary, the pieces after the first with the continuing-subword prefix; the unknown token for
        a word over the length limit or with a rest that no vocabulary entry starts. ``None`` past ``budget``
        lookups."""
        if len(word) > self._max_word_chars:
            return self._unk, 0
        vocab, continuing = self._vocab, self._continuing
        reach_first, reach_next = self._reach_first, self._reach_next
        ids: list[int] = []
        start, length, used = 0, len(word), 0
        while start < length:
            end = min(length, start + (reach_first if start == 0 else reach_next).get(word[start:start + 2], 1))
            while end > start:
                used += 1
                found = vocab.get(word[start:end] if start == 0 else continuing + word[start:end])
                if found is not None:
                    ids.append(found)
                    break
                end -= 1
            else:
                return self._unk, used
            if used > budget:
                return None, used
            start = end
        return ids, used


class LoneWordPiece:
    """``__call__(text)`` -> ``(token ids, truncated)``, or ``None`` for a text this path does not take."""

    def __init__(self, tokenizer: Any, normalize: AsciiBertNormalizer, added: re.Pattern[str] | None,
                 prefix: list[int], suffix: list[int], max_content: int) -> None:
        self._encoder = tokenizer  # NOTE: the full tokenizer: texts with a word not cached, until the split is made
        self._split: WordPieceSplit | None = None
        self._split_tried = False
        self._miss_texts = 0  # texts with a word not cached before the split was made
        self._normalize = normalize
        self._added = added
        self._prefix = prefix
        self._suffix = suffix
        self._max_content = max_content  # ids of the text's words kept under truncation
        # NOTE: tuples, not lists: a tuple of ints is untracked by the cyclic collector at the first collection that
        # meets it, where every cached list (up to MAX_CACHED_WORDS) stayed tracked and was walked by each full
        # collection of a long-running server, a pause that stalls every request in flight
        self._cache: dict[str, tuple[int, ...]] = {}

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
        return cls(tokenizer, normalize, pattern, affixes[0], affixes[1], max_length - specials)

    def __call__(self, text: str) -> tuple[list[int], bool] | None:
        normalized = self._normalize(text)
        if normalized is None or holds_added_token(self._added, text, normalized):
            return None
        words = _WORDS.findall(normalized)
        ids: list[int] = []
        cache, limit = self._cache, self._max_content
        budget = LOOKUPS_PER_CHAR * len(normalized) + LOOKUPS_PER_TEXT  # lookups for the words not cached
        for word in words:
            got = cache.get(word)
            if got is None:
                split = self._split if self._split is not None else self._make_split()
                if split is None:  # NOTE: the tokenizer encodes the text, the cache learns its words
                    return self._learn(text, words)
                pieces, used = split(word, budget)
                if pieces is None:  # NOTE: a pathological text (long words of rare pieces): the tokenizer's own
                    return None
                budget -= used
                got = tuple(pieces)
                if len(cache) < MAX_CACHED_WORDS:
                    cache[word] = got
            ids += got
            if len(ids) > limit:  # NOTE: truncated: the rest of a long text is never split
                return [*self._prefix, *ids[:limit], *self._suffix], True
        return [*self._prefix, *ids, *self._suffix], False

    def prepare(self) -> None:
        """Make the split now (a server's warm-up), not at the second text with a word not cached."""
        if not self._split_tried:
            self._split_tried = True
            self._split = WordPieceSplit.for_tokenizer(self._encoder)

    def _make_split(self) -> WordPieceSplit | None:
        """The split, made at the second text with a word not cached (reading the vocabulary costs ~20 ms, which
        a one-shot process with one text never pays); ``None`` before that or where the model's own split
        differs."""
        if not self._split_tried:
            self._miss_texts += 1
            if self._miss_texts >= 2:
                self.prepare()
        return self._split

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
                cache.setdefault(words[i], tuple(by_word[i]))
        return encoding.ids, truncated
