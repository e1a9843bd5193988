"""The character pre-cap of tokenization (pipeline/ingest/tokens.py) never changes a text's ids: a text longer
than the cap whose prefix does not fill max_length (a run of spaces, newlines or zero-width characters, a long
word that is one unknown token, before the words) is tokenized as Hugging Face tokenizes the whole text, and is
counted as truncated only when it is; vectors equal sentence-transformers'. The real MiniLM tokenizer and model."""

from __future__ import annotations

import numpy as np
import pytest

from petal.pipeline.ingest.tokens import TextTokenizer

TAIL = " how do glaciers move? they flow by internal deformation of the ice"
PADDED = [
    " " * 40_000 + TAIL,  # whitespace the normaliser drops
    "\n" * 20_000 + "\t" * 20_000 + TAIL,
    "\u200b" * 40_000 + TAIL,  # zero-width characters, removed
    "x" * 40_000 + TAIL,  # one word past max_input_chars_per_word: a single [UNK]
    "x" * 3_000 + " " * 9_000 + "y" * 30_000 + TAIL * 40,  # fills max_length only past several caps
]


def hf_ids(minilm_dir, texts: list[str], max_length: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(minilm_dir))
    return hf(texts, truncation=True, max_length=max_length)["input_ids"]


@pytest.mark.parametrize("max_length", [16, 256])
def test_a_long_prefix_that_tokenizes_to_little_keeps_the_words_after_it(minilm_dir, minilm_spec, max_length):
    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, max_length)
    assert all(len(t) > tokenizer.max_chars for t in PADDED)
    expected = hf_ids(minilm_dir, PADDED, max_length)
    batch = tokenizer.encode(PADDED)
    for i, text in enumerate(PADDED):
        np.testing.assert_array_equal(batch.token_ids[i], expected[i])
        alone = tokenizer.encode([text])  # the single-text encoder: the same
        np.testing.assert_array_equal(alone.token_ids[0], expected[i])
        assert alone.truncated[0] == batch.truncated[i]
    whole = [len(hf_ids(minilm_dir, [t], 100_000)[0]) for t in PADDED]
    assert batch.truncated.tolist() == [n > max_length for n in whole]


def test_a_capped_prefix_with_a_prompt_and_a_short_text_beside_it(minilm_dir, minilm_spec):
    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, 128, max_chars=300, prompt="query: ")
    texts = ["short", " " * 1000 + "glaciers", "word " * 400, "a " * 100]
    expected = hf_ids(minilm_dir, ["query: " + t for t in texts], 128)
    out = tokenizer.encode(texts)
    for ids, ref in zip(out.token_ids, expected):
        np.testing.assert_array_equal(ids, ref)
    assert out.truncated.tolist() == [False, False, True, False]


def test_embedder_vectors_of_padded_texts_match_sentence_transformers(minilm_dir):
    from sentence_transformers import SentenceTransformer

    import petal

    reference = SentenceTransformer(str(minilm_dir), device="cpu").encode(PADDED[:4], convert_to_numpy=True)
    with petal.Embedder(str(minilm_dir), device="cpu") as embedder:
        ours = np.asarray(embedder.encode(PADDED[:4]))
    cosine = (ours * reference).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.9999, cosine


def cut_word_text(max_chars: int, tokens_before: int, cut_at: int) -> str:
    """``tokens_before`` one-character tokens and a run of spaces, then a word of 200 characters (one [UNK]: longer
    than max_input_chars_per_word) that the character cap cuts after its first ``cut_at`` characters (as many
    WordPiece pieces), then TAIL."""
    head = "," * tokens_before
    return head + " " * (max_chars - len(head) - cut_at) + "qz" * 100 + TAIL


@pytest.mark.parametrize(("max_length", "tokens_before", "cut_at"), [(256, 240, 60), (256, 200, 99), (16, 10, 30)])
def test_a_word_the_cap_cuts_is_tokenized_whole(minilm_dir, minilm_spec, max_length, tokens_before, cut_at):
    """The cap cut a word of 200 characters (one [UNK] whole) after its first ``cut_at`` characters, whose pieces
    filled max_length: the text got those pieces and was counted as truncated, where the whole text holds fewer
    tokens than max_length (or, at 16, the [UNK] and TAIL's first words). Now a text whose kept tokens reach the
    word the cap cuts is tokenized from a longer prefix: the whole text's ids, truncated only when it is."""
    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, max_length)
    text = cut_word_text(tokenizer.max_chars, tokens_before, cut_at)
    expected = hf_ids(minilm_dir, [text], max_length)[0]
    whole = len(hf_ids(minilm_dir, [text], 100_000)[0])
    for out in (tokenizer.encode([text, "short"]), tokenizer.encode([text])):
        np.testing.assert_array_equal(out.token_ids[0], expected)
        assert out.truncated[0] == (whole > max_length)
        assert not out.cut_at_chars()[0]


def test_embedder_vector_of_a_text_with_a_word_the_cap_cuts_matches_sentence_transformers(minilm_dir, minilm_spec):
    from sentence_transformers import SentenceTransformer

    import petal

    max_chars = TextTokenizer(minilm_spec.tokenizer_file, 256).max_chars  # the cap at MiniLM's own max length
    texts = [cut_word_text(max_chars, 240, 60), "how do glaciers move?"]
    reference = SentenceTransformer(str(minilm_dir), device="cpu").encode(texts, convert_to_numpy=True)
    with petal.Embedder(str(minilm_dir), device="cpu") as embedder:
        embedded = embedder.embed(texts)
    ours = np.asarray(embedded.rows)
    cosine = (ours * reference).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.999, cosine
    assert embedded.truncated == 0  # 245 tokens: not over MiniLM's 256


def test_a_text_is_tokenized_from_its_first_max_text_chars_at_most(minilm_spec):
    """A text whose first ``MAX_TEXT_CHARS`` characters do not fill max_length (here one unknown word of 1 Mi
    accented letters before its words) is tokenized from them and counted as truncated: the longer prefixes stop
    there. Before, it was tokenized whole, whatever its length."""
    from petal.pipeline.ingest.tokens import MAX_TEXT_CHARS

    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, 256)
    text = "\u00e9" * (MAX_TEXT_CHARS + 1000) + TAIL
    out = tokenizer.encode([text, "short"])
    assert out.truncated.tolist() == [True, False]
    np.testing.assert_array_equal(out.token_ids[0], tokenizer.encode([text[:MAX_TEXT_CHARS]]).token_ids[0])
    np.testing.assert_array_equal(tokenizer.encode([text]).token_ids[0], out.token_ids[0])  # the one-text path


# the child says its own high-water mark (VmHWM), after tokenizing one text of ``sys.argv[2]`` characters
ENCODE = ("import sys\n"
          "from pathlib import Path\n"
          "from petal.pipeline.ingest.tokens import TextTokenizer\n"
          "tokenizer = TextTokenizer(Path(sys.argv[1]), 256)\n"
          "tokenizer.encode(['\\u00e9' * int(sys.argv[2]), 'short'])\n"
          "print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])\n")


def test_a_10_mb_row_of_one_unknown_word_takes_bounded_memory(minilm_spec):
    import subprocess
    import sys

    def peak_bytes(chars: int) -> int:
        done = subprocess.run([sys.executable, "-c", ENCODE, str(minilm_spec.tokenizer_file), str(chars)],
                              capture_output=True, text=True, timeout=300, check=True)
        return int(done.stdout.split()[-1]) * 1024

    over = peak_bytes(5_000_000) - peak_bytes(10)  # 10 MB of UTF-8; the text itself is 10 MB as a Python str
    assert over < 250 * (1 << 20), over / (1 << 20)  # was ~580 MiB: the tokenizer's copy and alignments of it all
