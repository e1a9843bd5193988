"""The character cap cuts a long text between words where the tokenizer splits at spaces (``space_cut``), so the cut
prefix's ids are the whole text's first ids on the fast encoder; elsewhere (no place between words near the cap, or a
pre-tokenizer that does not split at spaces) the word ids decide. Either way, a text's ids and truncated flag are what
the tokenizer gives the whole text: checked on random texts against the ``tokenizers`` library itself, for a BERT
WordPiece tokenizer (the packaged MiniLM's), a byte-level BPE one (RoBERTa's pre-tokenizer), one with Qwen's split
regex, and one whose Metaspace pre-tokenizer does not split (one word: never cut between words)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from petal.pipeline.ingest.tokens import TextTokenizer, space_cut, splits_at_spaces

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
              r"\s+(?!\S)|\s+")
PIECES = ["glacier", "ice", "flows", "by", "x" * 150, "é", "e\u0301", "中文", "日本語", "!", "...", ",", "(a)", "1234",
          "'s", "\u200b", "🍕", "qz" * 40]
GAPS = [" ", " ", " ", "  ", "\t", "\n", "\n\n", " \n ", "", "    "]


def texts(seed: int, count: int, length: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        parts: list[str] = []
        while sum(map(len, parts)) < length:
            parts += [rng.choice(PIECES), rng.choice(GAPS)]
        out.append("".join(parts)[: rng.randint(length // 2, length)])
    return out


def tokenizer_files(minilm_spec, root: Path) -> dict[str, Path]:
    from tokenizers import Regex, Tokenizer, pre_tokenizers

    from tests.test_roberta import write_roberta_tokenizer

    (root / "bpe").mkdir()
    write_roberta_tokenizer(root / "bpe")
    files = {"wordpiece": Path(minilm_spec.tokenizer_file), "bytelevel": root / "bpe" / "tokenizer.json"}
    qwen = Tokenizer.from_file(str(files["bytelevel"]))
    qwen.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    files["qwen-split"] = root / "qwen.json"
    qwen.save(str(files["qwen-split"]))
    whole = json.loads(Path(files["wordpiece"]).read_text())
    whole["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": False}
    files["unsplit"] = root / "unsplit.json"
    files["unsplit"].write_text(json.dumps(whole))
    return files


@pytest.mark.parametrize("max_length", [8, 32])
def test_long_texts_get_the_whole_texts_ids_whatever_the_pre_tokenizer(minilm_spec, tmp_path, max_length):
    from tokenizers import Tokenizer

    files = tokenizer_files(minilm_spec, tmp_path)
    sample = texts(seed=max_length, count=150, length=2_000)
    for name, file in files.items():
        reference = Tokenizer.from_file(str(file))
        assert splits_at_spaces(reference) == (name != "unsplit"), name
        reference.no_padding()
        reference.enable_truncation(max_length)
        expected = reference.encode_batch(sample)
        ours = TextTokenizer(file, max_length, max_chars=max_length * 4)  # most texts are over the cap
        assert sum(len(t) > ours.max_chars for t in sample) > 100
        batch = ours.encode(sample)
        for i, text in enumerate(sample):
            np.testing.assert_array_equal(batch.token_ids[i], expected[i].ids, err_msg=f"{name} {text[:80]!r}")
            assert batch.truncated[i] == bool(expected[i].overflowing), (name, text[:80])
        for i in range(0, len(sample), 15):  # the single-text encoder: the same
            np.testing.assert_array_equal(ours.encode([sample[i]]).token_ids[0], expected[i].ids, err_msg=name)


def test_space_cut_ends_after_a_word_that_a_space_or_tab_follows():
    assert space_cut("ab cd ef", 6) == 5  # "ab cd" | " ef"
    assert space_cut("ab cd ef", 4) == 2
    assert space_cut("ab\tcd", 3) == 2
    assert space_cut("ab\ncd ef", 4) is None  # a newline: a byte-level BPE's punctuation may take it in
    assert space_cut("ab   cd", 6) == 2  # after the word, never inside the run of spaces
    assert space_cut("x" * 5000 + " y", 4096) is None  # no place between words near the cap
