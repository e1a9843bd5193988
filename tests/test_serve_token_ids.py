"""``/v1/embeddings`` with token ids of another tokenizer: LangChain's ``OpenAIEmbeddings`` tokenizes with tiktoken
(ids up to ~100k for cl100k) and sends the ids unless ``check_embedding_ctx_length=False``. Such an id is outside the
served model's vocabulary: the 422 said only that, and now says that ids are the model's own tokenizer's and to send
the text (and how, for LangChain); the server keeps serving."""

from __future__ import annotations

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
