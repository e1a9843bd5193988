"""``/v1/embeddings`` with token ids of another tokenizer: LangChain's ``OpenAIEmbeddings`` tokenizes with tiktoken
(ids up to ~100k for cl100k) and sends the ids unless ``check_embedding_ctx_length=False``. Such an id is outside the
served model's vocabulary: the 422 said only that, and now says that ids are the model's own tokenizer's and to send
the text (and how, for LangChain); the server keeps serving."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tests._serve_shared import default_server

httpx = pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    return default_server(request, tmp_path_factory)


def test_another_tokenizers_ids_are_422_saying_to_send_the_text(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="any", max_retries=0)
    tiktoken_ids = [4438, 656, 2840, 12059, 3351, 100257]  # cl100k ids, as OpenAIEmbeddings sends them
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.embeddings.create(model="all-MiniLM-L6-v2", input=[tiktoken_ids])
    error = refused.value.body
    message = error["message"] if "message" in error else error["error"]["message"]
    assert message.startswith("input item 0: token id 100257 is outside the vocabulary (0..30521) of all-MiniLM-L6-v2")
    assert "send the text instead" in message and "check_embedding_ctx_length=False" in message, message
    answer = client.embeddings.create(model="all-MiniLM-L6-v2", input=["how do glaciers move"])
    assert len(answer.data[0].embedding) == 384


def python_steps(fn) -> int:
    """The Python lines and calls ``fn()`` runs (``sys.settrace``'s events: numpy's and orjson's C work is none)."""
    steps = 0

    def tracer(frame, event, arg):
        nonlocal steps
        steps += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return steps


def test_token_ids_are_read_and_checked_without_python_work_per_id():
    """256 lists of token ids were tested an id at a time in Python (parse_embeddings' type test, the copy to tuples
    and the vocabulary test: ~14 ms of the event loop per request of 512 ids each); now in C (the set of their types,
    one numpy conversion, numpy's range test): the Python work is the same for 512 ids a list as for 4."""
    from petal.pipeline.serve.requests import parse_embeddings
    from petal.pipeline.serve.service import checked_token_ids
    from petal.pipeline.serve.settings import Limits

    def steps(length: int) -> int:
        body = {"input": [[(7 * i + j) % 30522 for j in range(length)] for i in range(256)]}

        def run() -> None:
            request = parse_embeddings(body, Limits())
            tokens = checked_token_ids(request.token_ids, 30522, 512, "all-MiniLM-L6-v2", False)
            assert tokens.count == 256 * length and tokens.ids[3].dtype == np.int32
            assert tokens.ids[3].tolist() == body["input"][3]

        return python_steps(run)

    few, many = steps(4), steps(512)
    assert many <= few + 64, (few, many)


def test_token_id_lists_are_taken_and_refused_by_item(server):
    c = server.client
    ids = [101, 2129, 2079, 13403, 2693, 102]
    one = c.post("/v1/embeddings", json={"input": ids}).json()
    listed = c.post("/v1/embeddings", json={"input": [[101, 102], ids]}).json()
    # NOTE: equal up to float32 rounding: a batch of two rows runs other CPU kernel shapes than one (last-bit
    # differences on this environment of 2026-12-06, at e7ab810 too)
    np.testing.assert_allclose(listed["data"][1]["embedding"], one["data"][0]["embedding"], rtol=1e-5, atol=1e-7)
    assert listed["usage"]["prompt_tokens"] == 8 and one["usage"]["prompt_tokens"] == 6
    for body, status, text in (
            ({"input": [ids, [5, 10**30]]}, 422, "input item 1: token id 1000000000000000000000000000000 is outside"),
            ({"input": [ids, [5, -3]]}, 422, "input item 1: token id -3 is outside the vocabulary (0..30521)"),
            ({"input": [10**30]}, 422, "input item 0: token id 1000000000000000000000000000000 is outside"),
            ({"input": [ids, [5, True]]}, 422, "'input' item 1 position 1 is a boolean, not a token id (an integer)"),
            ({"input": [ids, []]}, 422, "'input' item 1 is an empty list of token ids"),
            ({"input": [ids, [5, 2.0]]}, 422, "'input' item 1 position 1 is 2.0, not a token id (an integer)"),
            ({"input": [ids, [7] * 300]}, 413, "input item 1 has more than 256 tokens")):
        answer = c.post("/v1/embeddings", json=body)
        assert answer.status_code == status and text in answer.json()["error"]["message"], (body, answer.text)
    cut = c.post("/v1/embeddings", json={"input": [[7] * 300], "truncate": True}).json()
    assert cut["usage"]["prompt_tokens"] == 256 and len(cut["data"][0]["embedding"]) == 384
