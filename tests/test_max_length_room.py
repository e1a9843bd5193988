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


@pytest.mark.parametrize("length", ["0", "1", "-1"])
def test_a_max_length_under_2_is_said_as_the_model_says_a_short_one(length):
    """``--max-length 0`` said "--max-length 0 < 2", ``--max-length 2`` "... leaves no token for the text ...; give at
    least 3": one wording, judged before the model loads (no model is needed to refuse it)."""
    from petal.pipeline.config import check_lengths

    done = subprocess.run([PETAL, "embed", "hello world", "--max-length", length], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    assert f"--max-length {length} leaves no token for the text: give more than the model's special tokens take " \
        "(at least 2)" in done.stderr.strip().splitlines()[-1], done.stderr
    with pytest.raises(ValueError, match=r"^--max-length 1 leaves no token for the text"):
        check_lengths(max_length=1)
    with pytest.raises(ValueError, match=r"^--max-length 2000000 is over 1048576, the most tokens of one engine step"):
        check_lengths(max_length=2_000_000)  # no token budget holds one such sequence: refused before the model


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


def test_petal_index_judges_the_query_prompt_it_keeps_for_the_index(tmp_path):
    """``petal index --query-prompt P`` with no room for text beside P: published (exit 0) an index whose every query
    then failed (2). Now 2 before OUT is made; with --max-length, the index's query side (the model's own query
    prompt) is judged too."""
    data = str(Path(__file__).resolve().parent.parent / "sample_data")
    for extra in (["--query-prompt", "word " * 300], ["--query-prompt", "word " * 20, "--max-length", "16"]):
        out = tmp_path / f"out{len(extra)}"
        done = subprocess.run([PETAL, "index", data, "--out", str(out), "--device", "cpu", *extra],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "leaves no token for the text" in done.stderr, done.stderr
        assert "prompt take" in done.stderr and not out.exists(), done.stderr


def test_the_api_judges_a_token_budget_and_a_cpu_dtype_before_torch(tmp_path):
    """``petal.Embedder(token_budget=64)`` (under the max length, 256) and ``petal.open_index(..., device='cpu',
    dtype='float16')`` were refused only after torch loaded (the engine's own check; the index at its first search
    by text, the model loaded)."""
    code = ("import sys, petal\n"
            "for make in (lambda: petal.Embedder(device='cpu', token_budget=64),\n"
            "             lambda: petal.Embedder(device='cpu', token_budget=100, max_length=128),\n"
            "             lambda: petal.open_index(sys.argv[1], device='cpu', dtype='float16'),\n"
            "             lambda: petal.open_index(sys.argv[1], device='cpu', attention='flashinfer')):\n"
            "    try:\n        make()\n    except petal.UsageError as e:\n        print(e)\n"
            "print('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[-1] == "False" and len(lines) == 5, done.stdout + done.stderr
    assert "token budget 64 < max length 256" in lines[0] and "token budget 100 < max length 128" in lines[1]
    assert "dtype float16 is not supported on the CPU" in lines[2] and "attention" in lines[3]
