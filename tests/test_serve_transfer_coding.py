"""A request body in a transfer coding other than chunked (``Transfer-Encoding: gzip, chunked``) is refused with 501
naming the coding (RFC 9112 §6.1), before the body is read; the HTTP parser undoes only chunked, so the body reached
the JSON reader still compressed: a misleading 400 "'utf-8' codec can't decode byte 0x8b". Chunked alone (and an
``identity`` beside it) is served as before.

Real components: a ``petal serve`` child process on an index of precomputed vectors (``served`` of
``tests/test_serve_upgrade_ignored.py``), raw sockets."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.test_serve_upgrade_ignored import _conversation, served  # noqa: F401  (the fixture)


def _chunked(coding: bytes, body: bytes) -> bytes:
    return (b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: " + coding
            + b"\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"deflate, chunked", b"GZIP , chunked",
                                    b"identity\r\nTransfer-Encoding: gzip, chunked",
                                    b"Identity\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked"])
def test_a_body_in_another_transfer_coding_is_501_naming_it(served, coding):  # noqa: F811
    server, body, _ = served
    ((status, answer),) = _conversation(server, [_chunked(coding, gzip.compress(body))], 1)
    assert status == 501, answer
    error = json.loads(answer)["error"]
    # NOTE: every Transfer-Encoding header is judged (two headers, identity then gzip: the first alone was)
    assert error["type"] == "not_implemented", error
    assert ("gzip" if b"gzip" in coding.lower() else "deflate") in error["message"].lower(), error


@pytest.mark.parametrize("coding", [b"chunked", b"identity, chunked"])
def test_chunked_bodies_are_still_served(served, coding):  # noqa: F811
    server, body, expected = served
    ((status, answer),) = _conversation(server, [_chunked(coding, body)], 1)
    assert status == 200, answer
    assert json.loads(answer) == expected
