"""``petal serve``: a POST body declared as something else than JSON (``curl -d``'s form encoding, text/plain)
is refused with 415 naming the type to send, not read as JSON; JSON types and a body without a Content-Type
are taken. A real server (a child process) on an index that ``petal index`` built, real HTTP (httpx)."""

from __future__ import annotations

import re
import socket

import pytest

from tests._serve_shared import default_server

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

BODIES = {"/v1/embeddings": b'{"input": "how do glaciers move"}', "/search": b'{"query": "glaciers", "k": 2}'}


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    """``petal serve OUT`` (default flags) on sample_data's index: the session's shared server
    (tests/_serve_shared.py); the tests here only send it requests."""
    return default_server(request, tmp_path_factory)


def _count(server, route: str, status: int) -> float:
    found = re.search(rf'^petal_requests_total\{{route="{re.escape(route)}",status="{status}"\}} ([\d.e+]+)',
                      server.client.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("route", sorted(BODIES))
@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain",
                                          "text/plain; charset=utf-8", "multipart/form-data; boundary=x",
                                          "application/octet-stream", "application/jsonl", "TEXT/JSON"])
def test_a_body_declared_as_not_json_is_refused_with_415(server, route, content_type):
    before = _count(server, route, 415)
    answer = server.client.post(route, content=BODIES[route], headers={"Content-Type": content_type})
    assert answer.status_code == 415, (content_type, answer.status_code, answer.text)
    assert answer.headers["content-type"] == "application/json" and answer.headers["accept-post"] == "application/json"
    error = answer.json()["error"]
    assert error["code"] == 415 and error["type"] == "invalid_request_error", error
    assert "send 'Content-Type: application/json'" in error["message"] and content_type in error["message"], error
    if content_type == "application/x-www-form-urlencoded":
        assert "curl -d" in error["message"]
    assert _count(server, route, 415) == before + 1
    # the server keeps serving
    assert server.client.post(route, content=BODIES[route], headers={"Content-Type": "application/json"}
                              ).status_code == 200


def test_curl_d_is_refused_and_curl_json_is_taken(server):
    """What `curl -d '{...}'` sends (form-encoded) and what `curl --json '{...}'` sends, byte for byte."""
    host, port = server.url.removeprefix("http://").split(":")

    def raw(headers: str) -> bytes:
        body = BODIES["/search"]
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(f"POST /search HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: curl/8.5.0\r\n{headers}"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        return answer

    refused = raw("Accept: */*\r\nContent-Type: application/x-www-form-urlencoded\r\n")
    assert refused.startswith(b"HTTP/1.1 415 ") and b"curl --json" in refused, refused[:400]
    taken = raw("Content-Type: application/json\r\nAccept: application/json\r\n")
    assert taken.startswith(b"HTTP/1.1 200 ") and b'"hits"' in taken, taken[:400]


@pytest.mark.parametrize("content_type", [None, "application/json", "application/json; charset=utf-8",
                                          "Application/JSON;charset=UTF-8", "application/vnd.api+json"])
def test_json_types_and_no_content_type_are_taken(server, content_type):
    headers = {} if content_type is None else {"Content-Type": content_type}
    for route, body in BODIES.items():
        answer = server.client.post(route, content=body, headers=headers)
        assert answer.status_code == 200, (route, content_type, answer.text)
    if content_type is None:  # httpx sends none for raw content: what a hand-written client may do
        request = server.client.build_request("POST", "/search", content=BODIES["/search"])
        assert "content-type" not in request.headers


def test_a_refused_type_is_said_before_the_body_is_read(server):
    """A form-encoded body over --max-body-bytes is still a 415 (the type is the mistake to fix first); a JSON body
    that is not JSON stays a 400."""
    big = b"x" * (5 << 20)
    answer = server.client.post("/v1/embeddings", content=big, headers={"Content-Type": "text/plain"})
    assert answer.status_code == 415, answer.text
    bad = server.client.post("/search", content=b"{not json", headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
