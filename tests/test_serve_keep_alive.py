"""``petal serve --keep-alive-s``: how long an idle keep-alive connection (or a new one that sends nothing) is kept.
It was uvicorn's fixed 5 s, below a load balancer's idle timeout (AWS ALB: 60 s), so a balancer reusing a connection
the server had just closed answered its client 502 now and then.

Real components: ``petal index --vectors-column`` over real Parquet, ``petal serve`` on a loopback port, raw sockets."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests.test_serve_audit_http import read_answer
from tests.test_serve_head_limit import _closed_within, _connect, _search
from tests.test_serve_upgrade_ignored import serve_vectors

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")


def test_a_longer_keep_alive_keeps_an_idle_connection_past_the_old_5_s(tmp_path):
    server, body, expected = serve_vectors(tmp_path, "--keep-alive-s", "9")
    try:
        with _connect(server) as sock, _connect(server) as silent:
            sock.sendall(_search(body))
            status, headers, answer = read_answer(sock)
            assert status == 200 and json.loads(answer) == expected
            assert headers.get("connection") != "close"
            assert not _closed_within(sock, 6.5)  # idle longer than uvicorn's 5 s
            sock.sendall(_search(body))  # the same connection serves the next request
            status, _, answer = read_answer(sock)
            assert status == 200 and json.loads(answer) == expected
            silent.sendall(_search(body))  # a new connection silent for 6.5 s is kept too
            status, _, answer = read_answer(silent)
            assert status == 200 and json.loads(answer) == expected
    finally:
        server.stop()
    assert server.proc.returncode == 0


def test_a_shorter_keep_alive_closes_idle_connections_sooner(tmp_path):
    server, body, expected = serve_vectors(tmp_path, "--keep-alive-s", "0.5")
    try:
        with _connect(server) as sock:
            sock.sendall(_search(body))
            status, _, answer = read_answer(sock)
            answered = time.monotonic()
            assert status == 200 and json.loads(answer) == expected
            with _connect(server) as silent:
                connected = time.monotonic()
                assert _closed_within(sock, 4)
                assert _closed_within(silent, 4)
                # NOTE: each timed from its own start (not the search's): 0.5 s, not uvicorn's 5 s
                assert time.monotonic() - answered < 4.5 and time.monotonic() - connected < 4.5
        assert server.client.post("/search", content=body,
                                  headers={"Content-Type": "application/json"}).json() == expected
    finally:
        server.stop()


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_keep_alive_that_is_no_time_is_a_usage_error(tmp_path, value):
    result = CliRunner().invoke(cli, ["serve", "--model", str(tmp_path), "--keep-alive-s", value])
    assert result.exit_code == 2, result.output
    assert "--keep-alive-s" in result.output


@pytest.mark.parametrize("after_request", [False, True])
def test_blank_lines_that_begin_no_request_do_not_hold_the_connection(tmp_path, after_request):
    """A bare CRLF (which the parser skips before a request line) stopped the keep-alive timer and started no head
    timer: two bytes held a connection for good, on a new connection or after an answer. It is closed after
    --keep-alive-s as any idle one; a request sent after blank lines is still served."""
    server, body, expected = serve_vectors(tmp_path, "--keep-alive-s", "1", "--header-timeout-s", "2")
    try:
        with _connect(server) as sock:
            if after_request:
                sock.sendall(_search(body))
                status, _, answer = read_answer(sock)
                assert status == 200 and json.loads(answer) == expected
            sock.sendall(b"\r\n")
            time.sleep(0.3)
            sock.sendall(b"\r\n\r\n")
            assert _closed_within(sock, 6)
        with _connect(server) as served:
            served.sendall(b"\r\n\r\n" + _search(body))
            status, _, answer = read_answer(served)
            assert status == 200 and json.loads(answer) == expected
    finally:
        server.stop()


@pytest.mark.parametrize("after_request", [False, True])
def test_a_trickle_of_blank_lines_does_not_extend_the_keep_alive(tmp_path, after_request):
    """Each blank line cancelled the keep-alive timer and a new one of a whole --keep-alive-s was armed: a CRLF a
    little more often than that held the connection for good. Bytes that begin no request keep the deadline the
    connection had (from its start or its last answer)."""
    server, body, expected = serve_vectors(tmp_path, "--keep-alive-s", "2", "--header-timeout-s", "10")
    try:
        with _connect(server) as sock:
            if after_request:
                sock.sendall(_search(body))
                status, _, answer = read_answer(sock)
                assert status == 200 and json.loads(answer) == expected
            started = time.monotonic()
            closed = False
            while not closed and time.monotonic() - started < 8:
                try:
                    sock.sendall(b"\r\n")
                except OSError:  # closed (reset) between two checks
                    closed = True
                    break
                closed = _closed_within(sock, 0.5)
            assert closed, "blank lines every 0.5 s held the connection for 8 s (--keep-alive-s 2)"
            # NOTE: ~2 s; below the loop's 8 s (a deadline re-armed by each line) and --header-timeout-s 10
            assert time.monotonic() - started < 6
    finally:
        server.stop()
