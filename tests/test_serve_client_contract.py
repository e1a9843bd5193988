"""``petal serve`` as its clients use it: what a client sends beside the body (``Expect``, ``CONNECT``) and the error
bodies the ``openai`` client reads, against a real server on loopback (the packaged MiniLM, sample_data's index)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests._serve_shared import default_server
from tests.test_serve_http_conformance import connect, counted_since, counts, exchange, read_all, statuses
from tests.test_serve_http_rfc import answer_of
from tests.test_serve_vectors_only import AUTH
from tests.test_serve_vectors_only import served as vectors_served  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    return default_server(request, tmp_path_factory)


def _head(path: str, body: bytes, extra: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra}\r\n").encode()


@pytest.mark.parametrize("expect, named", [
    ("200-ok", '"200-ok"'),
    ("x-foo", '"x-foo"'),
    ("100-continue, x-foo", '"x-foo"'),
    ("100-continue\r\nExpect: 200-ok", '"200-ok"'),
])
def test_an_expectation_other_than_100_continue_is_417_before_the_body(server, expect, named):
    """``Expect: 200-ok`` (or ``100-continue, x-foo``) was served as if it were not there; a client waiting for the
    expectation before sending its body got nothing until a timeout. RFC 9110 §10.1.1: 417 naming it, at once, the
    connection closed, counted by its route; the server serves on."""
    body = json.dumps({"query": "ice", "k": 1}).encode()
    before = counts(server)
    with connect(server) as sock:
        sock.sendall(_head("/search", body, f"Expect: {expect}\r\n"))  # the body is held back, as such a client does
        sock.settimeout(30)
        raw = read_all(sock)
    status, headers, error = answer_of(raw)
    assert status == 417 and headers["connection"] == "close", raw
    assert error["error"]["type"] == "expectation_failed" and named in error["error"]["message"], error
    assert "100-continue" in error["error"]["message"] and statuses(raw) == [417], raw
    assert counted_since(server, before) == {"/search 417": 1}
    # HTTP/1.0 predates Expect: ignored, as its 100-continue is; a GET's expectation is refused the same
    assert answer_of(exchange(server, b"GET /health HTTP/1.0\r\nExpect: 200-ok\r\n\r\n"))[0] == 200
    assert answer_of(exchange(server, b"GET /health HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\n\r\n"))[0] == 417
    assert server.client.get("/health").status_code == 200


def test_100_continue_in_any_case_is_still_met(server):
    body = json.dumps({"query": "ice", "k": 1}).encode()
    raw = exchange(server, _head("/search", body, "Expect: 100-Continue\r\nConnection: close\r\n") + body)
    assert raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 "), raw[:200]


@pytest.mark.parametrize("target", ["example.com:443", "127.0.0.1:8080", "/search", "/"])
def test_connect_is_405_with_allow_whatever_its_target(server, target):
    """A CONNECT (a client that takes this server for its proxy: ``curl -p``, ``https_proxy=``) to ``host:port`` was a
    400 "not valid HTTP/1.1", and to a path a 404 "no route": 405 with the server's Allow (the method is standard, this
    server is no proxy), after the answers before it, the tunnel bytes after it discarded, the connection closed;
    counted as route "unmatched"; the server serves on."""
    before = counts(server)
    connect_head = f"CONNECT {target} HTTP/1.1\r\nHost: {target.strip('/') or 'x'}\r\n\r\n".encode()
    raw = exchange(server, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + connect_head + b"\x16\x03\x01 tunnel bytes")
    assert statuses(raw) == [200, 405], raw
    body = raw.rpartition(b"HTTP/1.1 405 ")[2]
    _, headers, error = answer_of(b"HTTP/1.1 405 " + body)
    assert headers["allow"] == "GET, HEAD, POST, OPTIONS" and headers["connection"] == "close", raw
    assert error["error"]["type"] == "method_not_allowed" and f'CONNECT "{target}" is not allowed' in \
        error["error"]["message"] and "no proxy" in error["error"]["message"], error
    assert counted_since(server, before) == {"/health 200": 1, "unmatched 405": 1}
    # the first request of its connection, HTTP/1.1 or HTTP/1.0 (no Host): the same (it was a 400 there too)
    for alone in (connect_head, f"CONNECT {target} HTTP/1.0\r\n\r\n".encode()):
        status, headers, error = answer_of(exchange(server, alone))
        assert status == 405 and headers["allow"] == "GET, HEAD, POST, OPTIONS", (alone, error)
    assert server.client.get("/health").status_code == 200


def _openai(server):
    openai = pytest.importorskip("openai")
    return openai, openai.OpenAI(base_url=server.url + "/v1", api_key="any", max_retries=0)


@pytest.mark.parametrize("call, exception, param, said", [
    (dict(input="ice", dimensions=0), "UnprocessableEntityError", "dimensions", "'dimensions' must be >= 1"),
    (dict(input="ice", dimensions=100000), "UnprocessableEntityError", "dimensions", "the model has 384"),
    (dict(input="ice", encoding_format="float32"), "UnprocessableEntityError", "encoding_format", "float, base64"),
    (dict(input=[]), "UnprocessableEntityError", "input", "'input' is empty"),
    (dict(input=["ice", 5]), "UnprocessableEntityError", "input", "item 1 is an integer"),
    (dict(input=[[101, 30000000]]), "UnprocessableEntityError", "input", "outside the vocabulary"),
    (dict(input="ice", user=5), "UnprocessableEntityError", "user", "'user' must be a string"),
    (dict(input="ice", model="text-embedding-3-small"), "NotFoundError", "model", "is not served here"),
    (dict(input="ice", extra_body={"stream": True}), "UnprocessableEntityError", "stream", "unknown field(s) 'stream'"),
])
def test_the_openai_client_reads_each_error_with_its_param(server, call, exception, param, said):
    """The error body lacked OpenAI's ``param``: the ``openai`` client's exception had ``param`` None whatever field
    was wrong. Every error now carries it (the field, or null), and the client raises the class of its status with
    the server's message."""
    openai, client = _openai(server)
    with pytest.raises(getattr(openai, exception)) as caught:
        client.embeddings.create(**{"model": "all-MiniLM-L6-v2", **call})
    assert caught.value.param == param and said in caught.value.message, (caught.value.param, caught.value.message)
    assert set(caught.value.body) == {"message", "type", "param", "code"}, caught.value.body


def test_every_error_body_has_openai_s_four_fields(server):
    """Errors of the app (401-free server: 404, 405, 400 query string, 422) and of the HTTP layer (the parser's 400, a
    CONNECT's 405, a 505) alike."""
    answers = [server.client.get("/nope"), server.client.get("/search"), server.client.get("/health?x=1"),
               server.client.post("/search", json={"query": "ice", "k": 0})]
    bodies = [answer.json() for answer in answers]
    for raw in (b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
                b"CONNECT a:1 HTTP/1.1\r\nHost: a:1\r\n\r\n", b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n"):
        bodies.append(answer_of(exchange(server, raw))[2])
    for body in bodies:
        assert list(body) == ["error"] and list(body["error"]) == ["message", "type", "param", "code"], body
    assert [body["error"]["param"] for body in bodies] == [None, None, None, "k", None, None, None]


def test_the_openai_client_s_default_base64_equals_the_float_answer_and_petal_embed(server, tmp_path):
    """The ``openai`` client asks for base64 unless told (``encoding_format`` left out): the vectors it decodes equal
    the float answer's and ``petal embed``'s, with ``dimensions`` too (the first N values, renormalised)."""
    _, client = _openai(server)
    texts = ["how do glaciers move", "a cat on a mat"]
    out = tmp_path / "embedded.npy"
    subprocess.run([sys.executable, "-m", "petal.cli.main", "embed", *texts, "--output", str(out)], check=True,
                   capture_output=True, timeout=600)
    embedded = np.load(out)
    for dimensions in (None, 64):
        extra = {} if dimensions is None else {"dimensions": dimensions}
        decoded = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, **extra)
        floats = server.client.post("/v1/embeddings", json={"input": texts, "encoding_format": "float", **extra}).json()
        got = np.array([row.embedding for row in decoded.data], dtype=np.float32)
        assert np.array_equal(got, np.array([row["embedding"] for row in floats["data"]], dtype=np.float32))
        want = embedded[:, :dimensions]
        want = want / np.linalg.norm(want, axis=1, keepdims=True)
        assert got.shape == (2, dimensions or 384) and np.allclose(got, want, atol=1e-6), np.abs(got - want).max()
        assert decoded.usage.prompt_tokens == floats["usage"]["prompt_tokens"] > 0


def test_texts_on_an_index_of_vectors_name_their_field_as_param(vectors_served):  # noqa: F811
    """The 422 of texts sent to an index of precomputed vectors begins with the index, not the field: its param was
    null; it names the field sent."""
    server = vectors_served[0]
    for body, field in (({"query": "glaciers"}, "query"), ({"queries": ["glaciers", "coffee"]}, "queries")):
        answer = server.client.post("/search", json=body, headers=AUTH)
        assert answer.status_code == 422 and answer.json()["error"]["param"] == field, answer.text


@pytest.mark.parametrize("route", ["/v1/embeddings", "/search"])
def test_a_huge_field_name_is_cut_in_param_however_it_is_refused(server, route):
    """error.param of a repeated field held the whole name (a 200,000-character key: a 200 KB answer); an unknown
    field's was cut at 100 characters. Every param is cut alike, and the answer stays small."""
    key = "x" * 200_000
    for body in (f'{{"{key}": 1, "{key}": 2}}', f'{{"{key}": 1}}'):
        answer = server.client.post(route, content=body.encode(), headers={"content-type": "application/json"})
        assert answer.status_code == 422, answer.text[:500]
        assert answer.json()["error"]["param"] == key[:100] and len(answer.content) < 4096, len(answer.content)
