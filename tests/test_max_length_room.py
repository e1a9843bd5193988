"""A ``--max-length`` that leaves no token for the text: the model's special tokens (MiniLM's [CLS] [SEP]) and its
prompt take every place, so every text was cut to an empty text's ids and skipped as ``empty_text`` (petal embed and
petal index: "nothing to embed", 66; a run that reads as if the data were empty). Now a usage error (2) naming the
flag and the least length that holds a token of text; one more than the special tokens embeds, counted truncated.

Real tokenizer (the packaged MiniLM's), the real CLI in a child process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from petal.pipeline.ingest.tokens import TextTokenizer
from petal.pipeline.reliability.errors import FlagError

PETAL = str(Path(sys.executable).parent / "petal")


def test_embed_with_room_for_no_token_of_text_is_a_usage_error(minilm_dir):
    done = subprocess.run([PETAL, "embed", "hello world", "--max-length", "2"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    assert "--max-length 2 leaves no token for the text: the model's special tokens take 2; give at least 3" \
        in done.stderr.strip().splitlines()[-1]
    done = subprocess.run([PETAL, "embed", "hello world", "--max-length", "3"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "1 truncated at 3 tokens" in done.stderr, done.stderr


@pytest.mark.parametrize(("prompt", "taken"), [("", 2), ("query: ", 4)])
def test_the_tokenizer_counts_the_prompt_among_what_takes_the_room(minilm_spec, prompt, taken):
    with pytest.raises(FlagError, match=f"take {taken}; give at least {taken + 1}"):
        TextTokenizer(minilm_spec.tokenizer_file, taken, prompt=prompt)
    encoded = TextTokenizer(minilm_spec.tokenizer_file, taken + 1, prompt=prompt).encode(["glaciers move slowly"])
    assert len(encoded.token_ids[0]) == taken + 1 and encoded.truncated.tolist() == [True]


def test_the_api_and_petal_index_judge_the_room_before_the_model_loads(tmp_path):
    """``petal.Embedder(max_length=2)`` was made (the model loaded, torch imported) and refused only at its first
    ``encode``; ``petal index --max-length 2`` created and locked OUT first; a ``--query-prompt`` longer than the
    model's length was told its (truncated) length plus one and to give a ``--max-length`` that ``petal query`` has
    not. Now each is refused before torch loads, a prompt by its whole length."""
    code = ("import sys, petal\nfor kw in ({'max_length': 2}, {'query_prompt': 'word ' * 300}):\n    try:\n"
            "        petal.Embedder(device='cpu', **kw)\n    except petal.UsageError as e:\n        print(e)\n"
            "print('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[-1] == "False", done.stdout + done.stderr
    assert "max_length 2 leaves no token for the text" in lines[0]
    assert "special tokens and prompt take 302; give at least 303" in lines[1] and "shorter prompt" in lines[1]
    out = tmp_path / "out"
    done = subprocess.run([PETAL, "index", str(Path(__file__).resolve().parent.parent / "sample_data"), "--out",
                           str(out), "--max-length", "2", "--device", "cpu"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "--max-length 2 leaves no token" in done.stderr, done.stderr
    assert not out.exists()
