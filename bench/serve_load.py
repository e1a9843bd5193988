"""The load generator of ``petal bench serve``: client threads with keep-alive HTTP/1.1 connections
(``http.client``: little client overhead), spread over processes so the client's GIL is not what
is measured. Bounded by a request count and a deadline."""

from __future__ import annotations

import http.client
import itertools
import json
import multiprocessing as mp
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


@dataclass
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0


def _connect(host: str, port: int) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection(host, port, timeout=120)
    conn.connect()
    # NOTE: http.client sends headers and body in two writes; without TCP_NODELAY, Nagle holds the body
    # until the server's delayed ACK (40 ms), and that is what would be measured.
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _client(host: str, port: int, path: str, bodies: list[bytes], headers: dict[str, str], start: int,
            quota: itertools.count, max_requests: int, deadline: float, out: LoadResult,
            lock: threading.Lock) -> None:
    conn = _connect(host, port)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    i = start
    while time.perf_counter() < deadline and next(quota) < max_requests:
        body = bodies[i % len(bodies)]
        i += 1
        started = time.perf_counter()
        status: int | str  # the HTTP status, or the name of the connection error
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException) as exc:
            status = type(exc).__name__
            conn.close()
            conn = _connect(host, port)
        elapsed = time.perf_counter() - started
        if status == 200:
            latencies.append(elapsed)
        else:
            errors[str(status)] = errors.get(str(status), 0) + 1
    conn.close()
    with lock:
        out.latencies_s += latencies
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


def _process(args: tuple[Any, ...]) -> tuple[list[float], dict[str, int], float]:
    result = run_threads(*args)
    return result.latencies_s, result.errors, result.wall_s


def run_load(url: str, path: str, bodies: list[bytes], concurrency: int, max_requests: int, seconds: float,
             processes: int = 1, headers: dict[str, str] | None = None) -> LoadResult:
    """``concurrency`` clients over ``processes`` processes (spawned), ``max_requests`` / ``seconds`` bounds."""
    processes = max(1, min(processes, concurrency))
    if processes == 1:
        return run_threads(url, path, bodies, concurrency, max_requests, seconds, headers)
    shares = [concurrency // processes + (1 if p < concurrency % processes else 0) for p in range(processes)]
    args = [(url, path, bodies, share, -(-max_requests * share // concurrency), seconds, headers, p * 104729)
            for p, share in enumerate(shares)]
    out = LoadResult()
    with mp.get_context("spawn").Pool(processes) as pool:
        for latencies, errors, wall_s in pool.map(_process, args):
            out.latencies_s += latencies
            for key, n in errors.items():
                out.errors[key] = out.errors.get(key, 0) + n
            out.wall_s = max(out.wall_s, wall_s)
    return out


def json_bodies(items: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps(item).encode() for item in items]
