"""The load generator of ``petal bench serve``: client threads on raw keep-alive HTTP/1.1 sockets (each
request's bytes built once; a response read by its Content-Length), spread over processes so the
client's GIL is not what is measured. Bounded by a request count and a deadline.

Latency is end to end as a client sees it: from the first byte sent to the last byte of the response
read. The client's own CPU time per request is measured too (``client_cpu_s``), so it can be told apart.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

RECV_BYTES = 1 << 16
# NOTE: how long past a row's deadline an answer still in flight is waited for; a server that hung (alive, never
# answering) held a row for the socket's fixed 120 s timeout, its clients blocked in recv
LATE_S = 10.0


@dataclass
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    client_cpu_s: float = 0.0  # CPU time of the client threads (their own cost, summed)
    server_s: list[float] = field(default_factory=list)  # the server's own time per answer (Server-Timing "app")
    span_sums_s: dict[str, float] = field(default_factory=dict)  # Server-Timing spans, summed over answers
    # per answer: when it was sent (time.time(): one clock across the client processes), its latency and spans
    answers: list[tuple[float, float, dict[str, float]]] = field(default_factory=list)


def _connect(host: str, port: int, timeout_s: float) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout_s)
    # NOTE: without TCP_NODELAY, Nagle may hold a request behind the server's delayed ACK (40 ms)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def request_bytes(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """One whole HTTP/1.1 POST (keep-alive), headers and body."""
    shown = f"[{host}]" if ":" in host else host  # NOTE: an IPv6 address in brackets (a bare ::1 is a 400)
    lines = [f"POST {path} HTTP/1.1", f"Host: {shown}:{port}", f"Content-Length: {len(body)}",
             *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ProtocolError(Exception):
    """The server's answer could not be read as one HTTP/1.1 response with a Content-Length."""


def read_response(sock: socket.socket, buffer: bytearray) -> tuple[int, str | None]:
    """Read one response from ``sock`` (``buffer`` keeps what follows it): its status and its
    ``Server-Timing`` header, if any."""
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            break
        chunk = sock.recv(RECV_BYTES)
        if not chunk:
            raise ProtocolError("connection closed")
        buffer += chunk
    head = bytes(buffer[:end]).decode("latin-1")
    status_line, _, rest = head.partition("\r\n")
    length = None
    timing = None
    for line in rest.split("\r\n"):
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "server-timing":
            timing = value
    if length is None:
        raise ProtocolError(f"no Content-Length: {status_line}")
    total = end + 4 + length
    while len(buffer) < total:
        chunk = sock.recv(max(RECV_BYTES, total - len(buffer)))
        if not chunk:
            raise ProtocolError("connection closed in a body")
        buffer += chunk
    del buffer[:total]
    return int(status_line.split(" ", 2)[1]), timing


def parse_timing(value: str) -> dict[str, float]:
    """``name;dur=ms, ...`` -> seconds by name."""
    out = {}
    for part in value.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if dur:
            out[name] = float(dur) / 1000
    return out


def _client(host: str, port: int, path: str, bodies: list[bytes], headers: dict[str, str], start: int,
            quota: itertools.count, max_requests: int, deadline: float, out: LoadResult,
            lock: threading.Lock) -> None:
    requests = [request_bytes(host, port, path, body, headers) for body in bodies]
    buffer = bytearray()
    latencies: list[float] = []
    server: list[float] = []
    spans: dict[str, float] = {}
    answers: list[tuple[float, float, dict[str, float]]] = []
    errors: dict[str, int] = {}
    i = start
    cpu_started = time.thread_time()
    sock: socket.socket | None = None
    def late() -> float:  # the time left to the deadline, and LATE_S past it
        return max(deadline - time.perf_counter(), 0.0) + LATE_S

    try:  # NOTE: a server that is gone ends this client, counted (was: the thread died with a traceback)
        sock = _connect(host, port, late())
    except OSError as exc:
        errors[type(exc).__name__] = 1
    while sock is not None and time.perf_counter() < deadline and next(quota) < max_requests:
        request = requests[i % len(requests)]
        i += 1
        sent = time.time()
        started = time.perf_counter()
        status: int | str  # the HTTP status, or the name of the connection error
        timing = None
        try:
            sock.settimeout(late())  # a hung server: TimeoutError, counted, soon after the deadline
            sock.sendall(request)
            status, timing = read_response(sock, buffer)
        except (OSError, ProtocolError, ValueError) as exc:
            status = type(exc).__name__
            sock.close()
            try:
                sock, buffer = _connect(host, port, late()), bytearray()
            except OSError:
                sock = None
        elapsed = time.perf_counter() - started
        if status == 200:
            latencies.append(elapsed)
            parsed = parse_timing(timing) if timing else {}
            answers.append((sent, elapsed, parsed))
            for name, seconds in parsed.items():
                spans[name] = spans.get(name, 0.0) + seconds
                if name == "app":
                    server.append(seconds)
        else:
            errors[str(status)] = errors.get(str(status), 0) + 1
    cpu_s = time.thread_time() - cpu_started
    if sock is not None:
        sock.close()
    with lock:
        out.latencies_s += latencies
        out.client_cpu_s += cpu_s
        out.server_s += server
        out.answers += answers
        for name, seconds in spans.items():
            out.span_sums_s[name] = out.span_sums_s.get(name, 0.0) + seconds
        for key, n in errors.items():
            out.errors[key] = out.errors.get(key, 0) + n


def run_threads(url: str, path: str, bodies: list[bytes], threads: int, max_requests: int, seconds: float,
                headers: dict[str, str] | None = None, offset: int = 0) -> LoadResult:
    """``threads`` clients, each one request at a time, until ``max_requests`` in all or ``seconds`` pass."""
    parts = urlsplit(url)
    out, lock, quota = LoadResult(), threading.Lock(), itertools.count()
    send = {"Content-Type": "application/json", **(headers or {})}
    started = time.perf_counter()
    deadline = started + seconds
    workers = [threading.Thread(target=_client, args=(parts.hostname, parts.port, path, bodies, send,
                                                      offset + t * 7919, quota, max_requests, deadline, out, lock))
               for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out.wall_s = time.perf_counter() - started
    return out


def _process(args: tuple[Any, ...]) -> LoadResult:
    return run_threads(*args)


def _client_signals() -> None:
    """A client process leaves the stop signals to the benchmark (its parent): a terminal's Ctrl-C, sent to the
    whole process group, is ignored here, and the pool's SIGTERM when the benchmark ends it kills quietly. NOTE: each
    process said 'petal: interrupted by SIGINT' (the petal script's handler) or a KeyboardInterrupt traceback."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)


def run_load(url: str, path: str, bodies: list[bytes], concurrency: int, max_requests: int, seconds: float,
             processes: int = 1, headers: dict[str, str] | None = None) -> LoadResult:
    """``concurrency`` clients over ``processes`` processes (spawned), ``max_requests`` / ``seconds`` bounds."""
    processes = max(1, min(processes, concurrency))
    if processes == 1:
        return run_threads(url, path, bodies, concurrency, max_requests, seconds, headers)
    shares = [concurrency // processes + (1 if p < concurrency % processes else 0) for p in range(processes)]
    # NOTE: each process's part of max_requests, in proportion to its clients, the parts summing to it (each was
    # rounded up: --requests 5 over 4 processes sent 8)
    ends = [max_requests * sum(shares[: p + 1]) // concurrency for p in range(processes)]
    quotas = [end - start for start, end in zip([0, *ends], ends)]
    args = [(url, path, bodies, share, quota, seconds, headers, p * 104729)
            for p, (share, quota) in enumerate(zip(shares, quotas))]
    out = LoadResult()
    with mp.get_context("spawn").Pool(processes, initializer=_client_signals) as pool:
        for part in pool.map(_process, args):
            out.latencies_s += part.latencies_s
            out.client_cpu_s += part.client_cpu_s
            out.server_s += part.server_s
            out.answers += part.answers
            for name, seconds in part.span_sums_s.items():
                out.span_sums_s[name] = out.span_sums_s.get(name, 0.0) + seconds
            for key, n in part.errors.items():
                out.errors[key] = out.errors.get(key, 0) + n
            out.wall_s = max(out.wall_s, part.wall_s)
    return out


def slowest(answers: list[tuple[float, float, dict[str, float]]], share: float = 0.01) -> dict[str, Any] | None:
    """Where the slowest ``share`` of answers (by latency) spent their time: their count, their spans' mean ms,
    and how far apart they were sent (ms): a few ms for a whole tail means one stall held every request in
    flight (a pause of the whole server), seconds mean slow requests spread over the row."""
    if not answers:
        return None
    tail = sorted(answers, key=lambda a: a[1])[-max(1, int(len(answers) * share)):]
    names = {name for _, _, spans in tail for name in spans}
    sent = [a[0] for a in tail]
    return {"count": len(tail), "latency_ms": round(1000 * sum(a[1] for a in tail) / len(tail), 3),
            "spans_ms": {name: round(1000 * sum(spans.get(name, 0.0) for _, _, spans in tail) / len(tail), 3)
                         for name in sorted(names)},
            "sent_within_ms": round(1000 * (max(sent) - min(sent)), 1)}


def json_bodies(items: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps(item).encode() for item in items]
