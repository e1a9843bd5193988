"""``petal embed`` and ``petal query``: a text over the characters petal reads of a text (2^20) whose first 2^20
characters hold fewer tokens than the model's limit (one huge unknown word: one [UNK] to MiniLM) is said to be
truncated at those characters, not at the token limit. Before: "1 truncated at 256 tokens" (petal embed) and "1 query
longer than 256 tokens, truncated" (petal query), which it is not. A text over the token limit still says tokens.

The real CLI (click's runner) with the packaged MiniLM; petal query on the session's sample_data index."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests._serve_shared import sample_out

HUGE_WORD = "x" * 1_100_000
WORDS = "glacier " * 600  # over MiniLM's 256 tokens, within the characters


@pytest.mark.parametrize("as_stdin", [False, True])
def test_embed_says_which_limit_cut_each_text(as_stdin):
    """TEXT arguments go through ``Embedder.embed``, ``--stdin`` through ``embed_stream``."""
    if as_stdin:
        result = CliRunner().invoke(cli, ["embed", "--stdin"], input=f"{HUGE_WORD}\n{WORDS}\n")
    else:
        result = CliRunner().invoke(cli, ["embed", HUGE_WORD, WORDS])
    assert result.exit_code == 0, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.endswith("2 texts -> 2 384-dim float32 vectors, 0 skipped, 1 truncated at 256 tokens, "
                         "1 truncated at 1048576 characters"), last


def test_query_says_which_limit_cut_each_query(tmp_path_factory):
    out = sample_out(tmp_path_factory)
    result = CliRunner().invoke(cli, ["query", str(out), "--stdin"], input=f"{HUGE_WORD}\n{WORDS}\n")
    assert result.exit_code == 0, result.output
    lines = result.stderr.strip().splitlines()
    assert "petal query: 1 query longer than 256 tokens, truncated" in lines, lines
    assert "petal query: 1 query longer than the 1048576 characters petal reads of a text, truncated" in lines, lines
