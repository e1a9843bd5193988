"""``petal serve`` during its drain (after SIGTERM/SIGINT): a request that was arriving as the drain began is answered
503 with Retry-After and ``Connection: close`` (not a connection closed with no answer), while the request in flight
finishes and the process exits 0."""

from __future__ import annotations

import json
import signal
import socket
import time

import pytest

from tests.test_serve import Server, _held_in_queue, _wait_port_closed

pytest.importorskip("uvicorn")


def _request(body: bytes) -> bytes:
    return (b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def _read_all(sock: socket.socket, timeout_s: float = 30.0) -> bytes:
    sock.settimeout(timeout_s)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_request_arriving_as_the_drain_begins_is_answered_503_and_the_one_in_flight_finishes(tmp_path, sig):
    from petal.engine.loader import default_model_dir

    # NOTE: the drain lasts --max-wait-ms: the signal, the port's close and the arriving request's rest must fit in it
    server = Server(tmp_path / "log", "--model", default_model_dir(), "--max-wait-ms", "10000")
    try:
        host, port = server.url.removeprefix("http://").split(":")
        body = json.dumps({"input": "arriving during the drain"}).encode()
        request = _request(body)
        arriving = socket.create_connection((host, int(port)), timeout=30)
        in_flight = _held_in_queue(server, 1, 2)  # waits --max-wait-ms in the queue: the drain lasts that long
        arriving.sendall(request[:30])  # its head has begun
        server.proc.send_signal(sig)
        _wait_port_closed(server)  # the drain has begun
        arriving.sendall(request[30:])
        answer = _read_all(arriving)
        head, _, payload = answer.partition(b"\r\n\r\n")
        lines = head.decode().lower().split("\r\n")
        assert lines[0].startswith("http/1.1 503"), answer
        assert "retry-after: 1" in lines and "connection: close" in lines, answer
        error = json.loads(payload)["error"]
        assert error["type"] == "shutting_down" and "retry" in error["message"], error
        assert server.proc.wait(30) == 0
        deadline = time.monotonic() + 10
        while "response" not in in_flight[0] and "error" not in in_flight[0]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        response = in_flight[0]["response"]
        assert response.status_code == 200 and len(response.json()["data"]) == 2, response.text
        log = (tmp_path / "log").read_text()
        assert "Traceback" not in log and "stopped (in-flight requests drained)" in log.splitlines()[-1], log
    finally:
        server.stop()
