"""Tokenization with the model's fast tokenizer (``tokenizer.json`` through ``tokenizers``).

``encode_batch_fast`` runs on all cores (Rust threads, GIL released); the pipeline runs this stage
in a background thread so the device never waits on it. Truncation at the model's max length is
exact and counted per row; a character pre-cap keeps a multi-megabyte row from stalling it (a row whose
prefix does not fill max_length is encoded from longer prefixes, up to ``MAX_TEXT_CHARS`` characters from its first
token: a leading run of characters the tokenizer drops is passed over).

sentence-transformers conventions: a prompt (``Instruct: ...\nQuery:`` for Qwen3-Embedding
queries) is put in front of each text and truncated with it; last-token pooling needs the EOS
token at the end, appended here when the tokenizer's post-processor does not add it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from petal.engine.config import LENGTH_FLAG, PROMPT_FLAG, Source
from petal.pipeline.ingest.ascii_normalize import AsciiBertNormalizer
from petal.pipeline.ingest.lone_wordpiece import LoneWordPiece, added_tokens_pattern, holds_added_token
from petal.pipeline.ingest.prefetch import ordered_map
from petal.pipeline.ingest.tokenizer_settings import check_tokenizer_settings
from petal.pipeline.reliability.errors import ConfigError, FlagError, PetalError, one_line

if TYPE_CHECKING:
    from petal.engine.loader import ModelSpec
    from petal.pipeline.ingest.documents import Documents  # NOTE: types only: it imports pyarrow (0.1 s)


MAX_TEXT_CHARS = 1 << 20
# characters tokenized, at most, to find where a text starts whose first MAX_TEXT_CHARS the tokenizer drops
# (``TextTokenizer._first_token_at``): what the run holds beyond the characters seen in them
MAX_SKIP_TOKENIZED = 1 << 20


@dataclass(frozen=True)
class Encoded:
    token_ids: list[np.ndarray]  # one int32 array per text
    truncated: np.ndarray  # [num_texts] bool
    # [num_texts] bool, None: none. Of the truncated texts, those cut at ``max_text_chars`` characters (the most
    # petal reads of a text) with fewer tokens than the limit in them: not over the token limit, over the characters
    over_chars: np.ndarray | None = None

    def cut_at_chars(self) -> np.ndarray:
        """``over_chars``, all False when None."""
        return self.over_chars if self.over_chars is not None else np.zeros(len(self.token_ids), dtype=bool)


def run_of(chars: set[str]) -> re.Pattern[str]:
    """A regular expression for a run of ``chars`` (none too): one class of their code point ranges."""
    points = sorted(map(ord, chars))
    ranges: list[list[int]] = []
    for point in points:
        if ranges and point == ranges[-1][1] + 1:
            ranges[-1][1] = point
        else:
            ranges.append([point, point])
    parts = (re.escape(chr(low)) + ("-" + re.escape(chr(high)) if high > low else "") for low, high in ranges)
    return re.compile("[" + "".join(parts) + "]*" if ranges else "")


@dataclass(frozen=True)
class RoomSources:
    """Where a tokenizer's max length and prompt came from (``engine.config.Source``: a flag, or a file and key)."""

    max_length: Source = LENGTH_FLAG
    prompt: Source = PROMPT_FLAG


def no_room(max_length: int, taken: int, prompted: bool, sources: RoomSources) -> PetalError:
    """A max length that the special tokens (and the prompt, ``prompted``) fill, ``taken`` tokens: a usage error (2)
    naming the flag where one set the length or the prompt, else a bad configuration (78) naming the model's files.

    NOTE: a prompt and a max length both from the model's files (config_sentence_transformers.json's prompts,
    sentence_bert_config.json's max_seq_length) were a usage error naming --query-prompt, a flag nobody gave."""
    length, prompt = sources.max_length, sources.prompt
    least = f"at least {taken + 1}"
    if not prompted:
        if length.flag:
            return FlagError(f"{length.name} {max_length} leaves no token for the text: the model's special tokens "
                             f"take {taken}; give {least}")
        return ConfigError(f"{length.name} {max_length} leaves no token for the text: the model's special tokens "
                           f"take {taken}; the model's files need {least} (or give --max-length, where the command "
                           "takes it)")
    said = (f"the max length {max_length} leaves no token for the text: the model's special tokens and prompt take "
            f"{taken}")
    longer = f"({length.name})" if length.flag else "(--max-length, where the command takes it)"
    if length.flag or prompt.flag:  # NOTE: petal query has no --max-length: said as "where the command takes it"
        return FlagError(f"{said}; give {least} {longer} or a shorter prompt ({prompt.name})")
    return ConfigError(f"{said} (the prompt: {prompt.name}; the max length: {length.name}): the model's prompt "
                       f"leaves no room for text; shorten it there, or give {least} {longer}")


SPACE_CUT_WINDOW = 1024  # characters before the cap searched for a place between words
_WORD_THEN_SPACE = re.compile(r"\S[ \t]")


def splits_at_spaces(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s pre-tokenizer splits words at spaces (BERT's, byte-level BPE's regex, Metaspace's):
    then a text cut after a word that a space or tab follows has the whole text's first words, so its first tokens.
    NOTE: a probe, not a list of classes: a Metaspace that does not split, or no pre-tokenizer, gives one piece."""
    pre = tokenizer.pre_tokenizer
    if pre is None:
        return False
    try:
        starts = [start for _, (start, _) in pre.pre_tokenize_str("ab cd ef")]
    except Exception:  # NOTE: a pre-tokenizer the probe cannot run: cut as any other
        return False
    return starts in ([0, 2, 5], [0, 3, 6])


def space_cut(text: str, limit: int) -> int | None:
    """The last place at or before ``limit`` where a word ends and a space or tab follows (``text[:end]`` ends with
    the whole word: not a newline, which a byte-level BPE's punctuation takes in), searched in the last
    ``SPACE_CUT_WINDOW`` characters; ``None`` where there is none."""
    low = max(limit - SPACE_CUT_WINDOW, 0)
    last = None
    for match in _WORD_THEN_SPACE.finditer(text, low, limit + 1):
        last = match
    return last.start() + 1 if last is not None else None


class TextTokenizer:
    """A model's tokenizer, truncating at ``max_length`` tokens (special tokens included).

    ``prompt`` is prepended to every text; ``eos_token_id`` is appended to every non-empty
    encoding unless the tokenizer already ends its encodings with it (one slot is kept for it).
    """

    def __init__(self, tokenizer_file: Path, max_length: int, max_chars: int | None = None, *, prompt: str = "",
                 eos_token_id: int | None = None, vocab_size: int | None = None,
                 sources: RoomSources | None = None) -> None:
        """``sources``: where ``max_length`` and ``prompt`` came from (a flag, or the model's files), named where they
        leave no room for text (``no_room``); None: the flags (``--max-length``, ``--query-prompt``)."""
        from tokenizers import Tokenizer

        from petal.engine.weight_files import read_text

        self.max_length = max_length
        self.prompt = prompt
        # NOTE: the cap is generous (64 characters a token); a capped text is encoded whole where its prefix
        # does not fill max_length (``encode``), so the cap changes no text's ids.
        self.max_chars = max_chars if max_chars is not None else max(max_length * 64, 4096)
        # NOTE: the longest prefix encoded: a text whose first MAX_TEXT_CHARS characters hold fewer tokens than
        # max_length (one giant word) is encoded from them and counted as truncated (from its first token where
        # it holds none there: ``_first_token_at``). Encoded whole, a 10 MB row of one non-ASCII word took ~600 MB
        # in the tokenizer (~116 bytes a character: its normalised copy and alignments), four such rows at once four
        # times that.
        self.max_text_chars = max(MAX_TEXT_CHARS, self.max_chars)
        try:
            self._tokenizer = Tokenizer.from_str(read_text(tokenizer_file))
        except OSError:
            raise  # NOTE: named by read_text: permission denied 66, a read error 74, no bad model (78)
        except Exception as exc:  # NOTE: the tokenizers library raises a bare Exception for a file it cannot use
            raise ConfigError(f"cannot read {tokenizer_file} as a tokenizer: {one_line(str(exc))}") from exc
        check_tokenizer_settings(self._tokenizer, tokenizer_file)  # NOTE: before petal's own truncation replaces them
        # NOTE: the tokenizer of another model (a larger vocabulary) gives ids past the embedding table: an
        # IndexError on the CPU, a device-side assert on CUDA that ends the process's use of the GPU. Each
        # batch's largest id is checked, only when the tokenizer has ids the model's table lacks.
        self._vocab_size = vocab_size if vocab_size is not None and \
            self._tokenizer.get_vocab_size(with_added_tokens=True) > vocab_size else None
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        prompt_ids = len(self._tokenizer.encode(prompt).ids)  # an empty text's ids, uncut (the room check below)
        self.eos_token_id = eos_token_id
        self.appends_eos = eos_token_id is not None and self._tokenizer.encode("a").ids[-1:] != [eos_token_id]
        self._truncate_at = max_length - 1 if self.appends_eos else max_length
        self._tokenizer.enable_truncation(self._truncate_at)
        self._encode = getattr(self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch)
        self._splits_at_spaces = splits_at_spaces(self._tokenizer)
        # a lone plain-ASCII text without an added token's text (same ids either way, tests/test_parquet.py):
        # a BERT WordPiece tokenizer's whole encoding in Python with a word cache
        # (pipeline/ingest/lone_wordpiece.py); another one behind a BertNormalizer: normalised in Python,
        # encoded by a copy without the normaliser (pipeline/ingest/ascii_normalize.py)
        self._file = tokenizer_file
        self._added = added_tokens_pattern(self._tokenizer)
        self._wordpiece = LoneWordPiece.for_tokenizer(self._tokenizer, self._truncate_at, self._added)
        self._ascii = None if self._wordpiece is not None else AsciiBertNormalizer.for_tokenizer(self._tokenizer)
        self._bare: Any = None
        self._lone_texts = 0
        # NOTE: what an empty text encodes to (the prompt and the special tokens: MiniLM's [CLS] [SEP]): a text whose
        # ids are these is empty to the model (every character dropped by the normaliser: combining marks under
        # accent stripping, U+FFFD under BERT's cleaning), and gives the same vector as every other such text
        self._empty_ids = np.array(self._tokenizer.encode(prompt).ids, dtype=np.int32)
        taken = prompt_ids + (1 if self.appends_eos else 0)
        if max_length <= taken:  # NOTE: else every text was cut to the special tokens: skipped as empty_text (66)
            raise no_room(max_length, taken, bool(prompt), sources or RoomSources())

    def encode(self, texts: list[str]) -> Encoded:
        token_ids, overflowed, capped = self._encode_capped(texts)
        # NOTE: a text whose first max_text_chars characters the tokenizer drops, every one (a run of spaces,
        # zero-width characters or combining marks before its words), is read from its first token on: the
        # characters petal reads of a text start there, so such a text is not an empty one. Its ids are the ids
        # of the text from that token (the dropped run adds none), cut as any text at max_text_chars characters
        blank = [i for i in np.flatnonzero(capped & ~overflowed) if self._is_empty(token_ids[i])]
        found = {i: self._first_token_at(texts[i]) for i in blank}
        for i, start in found.items():
            if start is not None and start >= len(texts[i]):
                capped[i] = False  # read to its end: nothing the model sees, an empty text, not a cut one
        later = [(i, start) for i, start in found.items() if start is not None and start < len(texts[i])]
        if later:
            # NOTE: one character past the characters read, so a longer text is said to be cut there
            again, again_over, again_capped = self._encode_capped([texts[i][start: start + self.max_text_chars + 1]
                                                                   for i, start in later])
            for (i, _), ids, over, cut in zip(later, again, again_over, again_capped):
                token_ids[i], overflowed[i], capped[i] = ids, over, cut
        if self.appends_eos:
            eos = np.array([self.eos_token_id], dtype=np.int32)
            token_ids = [np.concatenate([ids, eos]) if len(ids) else ids for ids in token_ids]
        if self._vocab_size is not None:
            self._check_vocabulary(token_ids)
        return Encoded(token_ids, overflowed | capped, capped & ~overflowed)

    def _encode_capped(self, texts: list[str]) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """``_encode_prompted`` of each text's first characters (up to ``max_text_chars``), and whether each text
        was cut at them (longer than what was read of it)."""
        capped = np.fromiter((len(t) > self.max_chars for t in texts), dtype=bool, count=len(texts))
        if not capped.any():
            all_ids, all_over = self._encode_prompted(texts)
            return all_ids, all_over, capped
        whole = [i for i, cut in enumerate(capped.tolist()) if not cut]
        token_ids: list[np.ndarray] = [np.empty(0, dtype=np.int32)] * len(texts)
        overflowed = np.zeros(len(texts), dtype=bool)
        if whole:
            whole_ids, whole_over = self._encode_prompted([texts[i] for i in whole])
            for i, one, flag in zip(whole, whole_ids, whole_over):
                token_ids[i], overflowed[i] = one, flag
        # NOTE: the cap can cut tokens the whole text has within max_length: characters the tokenizer drops
        # or folds (a run of spaces, newlines or zero-width characters; a long word that is one unknown
        # token), and a word the cap splits is another word: "qz" * 100 is one [UNK] under MiniLM, its first 60
        # characters 60 pieces, which filled max_length where the whole text held 245 tokens. A capped text that
        # did not fill max_length, or whose kept tokens reach the last word of the characters read, is encoded
        # again from a 4x longer prefix, up to the whole text, so its ids are the whole text's (at most ~4/3 of
        # encoding it whole).
        limit = self.max_chars
        short = [i for i, cut in enumerate(capped.tolist()) if cut]
        while short:
            # NOTE: cut between words where the tokenizer splits at spaces (the text's first words are then its
            # own): ids as fast as an uncut text's; elsewhere the word ids say whether the cut word was reached
            ends = {i: space_cut(texts[i], limit) if self._splits_at_spaces else None for i in short}
            clean = [i for i in short if ends[i] is not None]
            unclean = [i for i in short if ends[i] is None]
            results: dict[int, tuple[np.ndarray, bool, bool]] = {}
            if clean:
                clean_ids, clean_over = self._encode_prompted([texts[i][: ends[i]] for i in clean])
                results.update((i, (ids, bool(over), False)) for i, ids, over in zip(clean, clean_ids, clean_over))
            if unclean:
                cut_ids, cut_over, unsure = self._encode_cut([texts[i][:limit] for i in unclean])
                results.update((i, (ids, bool(over), bool(cut_word)))
                               for i, ids, over, cut_word in zip(unclean, cut_ids, cut_over, unsure))
            retry = []
            for i in short:
                token_ids[i], overflowed[i], cut_word = results[i]
                end = ends[i]
                capped[i] = len(texts[i]) > (end if end is not None else limit)
                if capped[i] and (cut_word or not overflowed[i]):
                    retry.append(i)
            if limit >= self.max_text_chars:
                break
            short, limit = retry, min(limit * 4, self.max_text_chars)
        return token_ids, overflowed, capped

    def _encode_cut(self, texts: list[str]) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """``_encode_prompted`` of texts cut at a character count, and whether each one's kept tokens reach the last
        word of its characters (the word the cut may have split: ids that the whole text may not have).

        NOTE: the tokenizer's ``encode``/``encode_batch``, not ``encode_batch_fast`` nor the lone path, which give no
        word ids: ~1.2x to tokenize in a batch, ~9 ms rather than ~0.4 ms alone (16 Ki characters, 2-core CPU), so
        only for texts ``space_cut`` finds no place to cut between words in."""
        prompted = [self.prompt + t for t in texts] if self.prompt else texts
        encodings = [self._tokenizer.encode(prompted[0])] if len(prompted) == 1 else \
            self._tokenizer.encode_batch(prompted)
        token_ids = [np.array(e.ids, dtype=np.int32) for e in encodings]
        overflowed = np.zeros(len(texts), dtype=bool)
        unsure = np.zeros(len(texts), dtype=bool)
        for i, encoding in enumerate(encodings):
            rest = encoding.overflowing
            if rest:
                overflowed[i] = True
                kept = [w for w in encoding.word_ids if w is not None]
                last = [w for w in rest[-1].word_ids if w is not None]
                unsure[i] = bool(kept) and bool(last) and kept[-1] >= last[-1]
        return token_ids, overflowed, unsure

    def _first_token_at(self, text: str) -> int | None:
        """Where ``text``'s first token starts (its character), given that the tokenizer drops every one of its
        first ``max_text_chars`` characters; ``len(text)`` where it drops them all; None where that is not found
        within ``MAX_SKIP_TOKENIZED`` characters tokenized (a run of ever new characters the tokenizer drops).

        NOTE: bounded time and memory whatever the text's length: the characters seen dropped are skipped with a
        regular expression (a few ns a character, no copy of the text), and only what follows them is tokenized,
        in windows from ``max_chars`` to ``max_text_chars`` characters, ``MAX_SKIP_TOKENIZED`` in all. A
        character the tokenizer drops in a run of them is dropped wherever a run holds it (spaces, control and
        zero-width characters, marks that accent stripping removes)."""
        dropped = set(text[: self.max_text_chars])
        position, window, budget = self.max_text_chars, self.max_chars, MAX_SKIP_TOKENIZED
        while True:
            position = run_of(dropped).match(text, position).end()  # type: ignore[union-attr]  # "*": always
            if position >= len(text):
                return len(text)
            if budget <= 0:
                return None
            piece = text[position: position + min(window, budget)]
            encoding = self._tokenizer.encode(piece)  # no prompt; truncated at max_length: the first tokens kept
            first = next((start for (start, _), part in zip(encoding.offsets, encoding.sequence_ids)
                          if part is not None), None)
            if first is not None:
                return position + first
            dropped.update(piece)
            position += len(piece)
            budget -= len(piece)
            window = min(window * 4, self.max_text_chars)

    def _is_empty(self, token_ids: np.ndarray) -> bool:
        """``token_ids`` (of ``_encode_prompted``: no EOS appended) are an empty text's."""
        return len(token_ids) == len(self._empty_ids) and bool(np.array_equal(token_ids, self._empty_ids))

    def sees_nothing(self, token_ids: np.ndarray) -> bool:
        """``token_ids`` (of ``encode``) are an empty text's: no token of the text itself, only the prompt's and the
        special tokens (and the EOS appended)."""
        return self._is_empty(token_ids[:-1] if self.appends_eos and len(token_ids) else token_ids)

    def _encode_prompted(self, texts: list[str]) -> tuple[list[np.ndarray], np.ndarray]:
        """``prompt + text``'s ids (int32, truncated at max_length, no EOS appended yet) and whether each overflowed."""
        if self.prompt:
            texts = [self.prompt + t for t in texts]
        # NOTE: one text alone: the single-text encoder is about twice as fast as a batch of one (no
        # thread-pool dispatch); the same ids and overflow either way (tests/test_parquet.py)
        if len(texts) == 1:
            ids, over = self._encode_one(texts[0])
            return [np.array(ids, dtype=np.int32)], np.array([over])
        encodings = self._encode(texts)
        return ([np.array(e.ids, dtype=np.int32) for e in encodings],
                np.fromiter((bool(e.overflowing) for e in encodings), dtype=bool, count=len(encodings)))

    def _check_vocabulary(self, token_ids: list[np.ndarray]) -> None:
        assert self._vocab_size is not None
        largest = max((int(ids.max()) for ids in token_ids if len(ids)), default=-1)
        if largest >= self._vocab_size:
            raise ConfigError(f"{self._file} gives token id {largest}, but the model has {self._vocab_size} tokens "
                              "(config.json vocab_size): is the tokenizer this model's?")

    def _encode_one(self, text: str) -> tuple[list[int], bool]:
        """One text's ids and whether it was truncated, on the fastest path that gives the batch path's."""
        if self._wordpiece is not None:
            got = self._wordpiece(text)
            if got is not None:
                return got
        elif self._ascii is not None:
            normalized = self._ascii(text)
            # NOTE: an added token's text ("[MASK]") is matched before the normaliser: only the full tokenizer
            if normalized is not None and not holds_added_token(self._added, text, normalized):
                if self._bare is None:
                    # NOTE: the copy costs a second read of tokenizer.json (~35 ms): made at the second lone
                    # text, so batch jobs and one-shot processes (one text) never pay for it
                    self._lone_texts += 1
                    if self._lone_texts >= 2:
                        self._bare = self._bare_copy()
                if self._bare is not None:
                    encoding = self._bare.encode(normalized)
                    return encoding.ids, bool(encoding.overflowing)
        encoding = self._tokenizer.encode(text)
        return encoding.ids, bool(encoding.overflowing)

    def prepare_lone(self) -> None:
        """Make what the lone-text path builds on its second text now (a server's warm-up, so no request
        pays it): the WordPiece split (~20 ms, reading the vocabulary) or the copy without the normaliser
        (~35 ms, reading tokenizer.json again)."""
        if self._wordpiece is not None:
            self._wordpiece.prepare()
        elif self._ascii is not None and self._bare is None:
            self._bare = self._bare_copy()

    def _bare_copy(self) -> Any:
        from tokenizers import Tokenizer

        bare = Tokenizer.from_file(str(self._file))
        bare.normalizer = None
        bare.no_padding()
        bare.enable_truncation(self._truncate_at)
        return bare


def tokenizer_for(spec: ModelSpec, side: Literal["query", "document"] = "document",
                  prompt: str | None = None) -> TextTokenizer:
    """The tokenizer that feeds ``spec``'s model: its max length, EOS rule and ``side``'s prompt
    (``prompt`` overrides the model's)."""
    chosen = prompt if prompt is not None else (spec.prompts.query if side == "query" else spec.prompts.document)
    return TextTokenizer(spec.tokenizer_file, spec.pooling.max_length, prompt=chosen,
                         eos_token_id=spec.eos_token_id, vocab_size=spec.config.vocab_size,
                         sources=room_sources(spec, side, prompt is not None))


def room_sources(spec: ModelSpec, side: Literal["query", "document"], prompt_given: bool = False,
                 length: Source | None = None) -> RoomSources:
    """Where ``spec``'s max length (``length`` where a flag set another) and ``side``'s prompt came from
    (``prompt_given``: a prompt passed in, the --query-prompt flag's)."""
    prompt = PROMPT_FLAG if prompt_given else \
        spec.sources.query_prompt if side == "query" else spec.sources.document_prompt
    return RoomSources(max_length=length or spec.sources.max_length, prompt=prompt)


@dataclass
class TokenizedDocs:
    """Documents of one shard, tokenized: ``token_ids[i]`` belongs to ``rows[i]`` / ``ids[i]``."""

    shard_index: int
    rows: list[int]
    ids: list
    token_ids: list[np.ndarray]
    truncated_rows: list[int]
    rejects: list[tuple[int, str]] = field(default_factory=list)
    final: bool = False
    # (row, id) of the rejects made here, after the read checks took their id (``to_documents``): a later row of the
    # shard with that id is a ``duplicate_id`` all the same (a range's assembly needs them: store/ranges.py)
    claimed: list[tuple[int, Any]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)


# NOTE: batches read and not yet tokenized, whatever ``workers``: part of the read window that
# ``ReadConfig.max_batch_bytes`` bounds (pipeline/ingest/documents.py READ_WINDOW_BATCHES)
TOKENIZE_WINDOW = 4


def tokenize_documents(docs: Iterable[Documents], tokenizer: TextTokenizer,
                       workers: int = 1) -> Iterator[TokenizedDocs]:
    """Tokenize each ``Documents`` batch, in order; a text that yields no tokens of its own (``sees_nothing``)
    becomes an ``empty_text`` reject.

    ``workers`` > 1 tokenizes that many batches at once (the Rust encoder releases the GIL), so the
    reading and checking of the next batches and the Python side of each batch overlap the encoding;
    at most ``TOKENIZE_WINDOW`` batches are in flight (host memory).
    """
    workers = min(workers, TOKENIZE_WINDOW)
    return ordered_map(lambda batch: tokenize_batch(batch, tokenizer), docs, workers,
                       window=max(workers, min(2 * workers, TOKENIZE_WINDOW)))


def tokenize_batch(batch: Documents, tokenizer: TextTokenizer) -> TokenizedDocs:
    encoded = encode_or_empty(tokenizer, batch.texts)
    out = TokenizedDocs(batch.shard_index, [], [], [], [], list(batch.rejects), batch.final)
    for row, doc_id, ids, truncated in zip(batch.rows, batch.ids, encoded.token_ids, encoded.truncated):
        if len(ids) == 0 or tokenizer.sees_nothing(ids):  # nothing the model sees: as a blank text
            out.rejects.append((row, "empty_text"))
            out.claimed.append((row, doc_id))
            continue
        out.rows.append(row)
        out.ids.append(doc_id)
        out.token_ids.append(ids)
        if truncated:
            out.truncated_rows.append(row)
    return out


def encode_or_empty(tokenizer: TextTokenizer, texts: list[str]) -> Encoded:
    if not texts:
        return Encoded([], np.zeros(0, dtype=bool))
    return tokenizer.encode(texts)
