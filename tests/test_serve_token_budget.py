"""``petal serve --token-budget`` and ``--max-wait-ms``: a batch launches when the queued texts fill the budget, or
when the oldest has waited ``--max-wait-ms``.

Before, a budget under the model's max length was raised to it without a word (``--token-budget 128`` with MiniLM
ran steps of 256 tokens, so two requests of 64 tokens never filled it), and a queued text counted a token per 4
characters (``"a " * 200``, 401 tokens, counted 101): texts of short words waited out ``--max-wait-ms`` with the
budget full. A batch that does not fill waits the whole ``--max-wait-ms``, so these waits are bounded well under it."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests._serve_shared import copy_sample_out

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

WAIT_MS = 60_000  # --max-wait-ms (its most): a request that does not fill the budget waits this long


@pytest.mark.parametrize("flags", [["--token-budget", "128"], ["--token-budget", "255", "--max-tokens-per-text", "64"]])
def test_a_budget_under_the_models_max_length_is_a_usage_error(tmp_path_factory, flags):
    out = copy_sample_out(tmp_path_factory, tmp_path_factory.mktemp("budget") / "out")
    result = CliRunner().invoke(cli, ["serve", str(out), "--port", "0", *flags])
    assert result.exit_code == 2, result.output
    assert f"--token-budget {flags[1]} is under the model's max length (256 tokens)" in result.output, result.output
    assert "give --token-budget 256 or more" in result.output
    assert "listening" not in result.output and "Traceback" not in result.output


def test_model_alone_a_budget_under_its_max_length_is_a_usage_error(minilm_dir):
    result = CliRunner().invoke(cli, ["serve", "--model", str(minilm_dir), "--port", "0", "--token-budget", "200"])
    assert result.exit_code == 2, result.output
    assert "--token-budget 200 is under the model's max length (256 tokens)" in result.output, result.output


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.test_serve import Server

    root = tmp_path_factory.mktemp("serve-token-budget")
    server = Server(root / "server.log", copy_sample_out(tmp_path_factory, root / "out"),
                    "--token-budget", 256, "--max-wait-ms", WAIT_MS)
    yield server
    server.stop()


@pytest.mark.parametrize("body", [
    {"input": [[7] * 128, [7] * 128]},  # token ids: 256, the budget exactly
    {"input": ["a " * 200, "a " * 200], "truncate": True},  # short words: 2 x 256 tokens, 2 x 100 by characters
    {"input": ["x, " * 150], "truncate": True},  # punctuation: 256 tokens
], ids=["token-ids", "short-words", "punctuation"])
def test_a_request_that_fills_the_budget_launches_at_once(server, body):
    started = time.monotonic()
    answer = server.client.post("/v1/embeddings", json=body, timeout=WAIT_MS / 1000 + 60)
    waited_s = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] >= 256
    assert waited_s < WAIT_MS / 1000 / 4, f"a full budget waited {waited_s:.1f} s of --max-wait-ms"
