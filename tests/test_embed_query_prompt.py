"""``petal embed --query-prompt TEXT`` without ``--query`` embeds its texts as queries with that prompt (README,
"Your own model"), which the Python API spells ``Embedder(query_prompt=TEXT).encode(texts, query=True)``; without
either, texts embed as documents, the prompt unused. The packaged model, a real ``petal embed`` process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import petal

PETAL = str(Path(sys.executable).parent / "petal")
PROMPT = "search query: "
TEXT = "how do glaciers move"


def _cli(*argv: str) -> np.ndarray:
    done = subprocess.run([PETAL, "embed", TEXT, *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return np.array(json.loads(done.stdout.splitlines()[0])["embedding"], np.float32)


def test_a_query_prompt_alone_embeds_as_a_query_with_it(minilm_dir):
    with petal.Embedder(device="cpu", query_prompt=PROMPT) as embedder:
        as_query = embedder.encode([TEXT], query=True)[0]
        as_document = embedder.encode([TEXT])[0]
    assert np.abs(as_query - as_document).max() > 1e-3  # the prompt changes the vector
    np.testing.assert_allclose(_cli("--query-prompt", PROMPT), as_query, atol=1e-6)
    np.testing.assert_allclose(_cli("--query-prompt", PROMPT, "--query"), as_query, atol=1e-6)
    np.testing.assert_allclose(_cli(), as_document, atol=1e-6)
