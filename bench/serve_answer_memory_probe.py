"""``petal serve`` memory when clients send a small /search with a huge answer and never read it: the server's peak
RSS (psutil, every 50 ms) while CLIENTS such connections are open, at ``--max-answer-bytes-in-flight`` 256 MiB (the
default) and at 1 TiB (no bound in practice: what the server did before the flag). The index: sample_data, built
here with the packaged MiniLM. Each request: 256 query texts, ``k`` 1000, ``include`` text and metadata (~50 MB of
JSON on that index). From the project root:

    python bench/serve_answer_memory_probe.py [CLIENTS]   (default 12)
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

BOUNDS = {"256 MiB (default)": 256 << 20, "1 TiB (unbounded)": 1 << 40}
BODY = json.dumps({"queries": [f"how do glaciers move {i}" for i in range(256)], "k": 1000,
                   "include": ["text", "metadata"]}).encode()


def start(out: Path, bound: int, log: Path) -> tuple[subprocess.Popen[bytes], str, int]:
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "serve", str(out), "--port", "0",
                                 "--log-level", "warning", "--max-answer-bytes-in-flight", str(bound),
                                 "--send-timeout-s", "600"], stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 120
    while not (found := re.search(r"listening on http://([\d.]+):(\d+)", log.read_text(errors="replace"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"petal serve did not start:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)
    return proc, found.group(1), int(found.group(2))


def silent_client(host: str, port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, port))
    sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)
    return sock


def answered(host: str, port: int) -> tuple[int, int]:
    """(requests answered 200, answered 503) on /search, from /metrics."""
    with socket.create_connection((host, port)) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        text = b""
        while chunk := sock.recv(1 << 16):
            text += chunk
    counts = [re.search(rb'petal_requests_total\{route="/search",status="%d"\} (\S+)' % s, text) for s in (200, 503)]
    return tuple(int(float(c.group(1))) if c else 0 for c in counts)  # type: ignore[return-value]


def measure(out: Path, bound: int, clients: int, work: Path) -> tuple[float, float, int, int]:
    proc, host, port = start(out, bound, work / f"serve-{bound}.log")
    server = psutil.Process(proc.pid)
    base = server.memory_info().rss
    peak = base
    socks = [silent_client(host, port) for _ in range(clients)]
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, server.memory_info().rss)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    deadline = time.monotonic() + 600
    while sum(answered(host, port)) < clients and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2)
    stop.set()
    sampler.join()
    ok, refused = answered(host, port)
    for sock in socks:
        sock.close()
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    return base / 2**20, peak / 2**20, ok, refused


def main() -> None:
    clients = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-m", "petal.cli.main", "index", "sample_data", "--out", str(work / "out"),
                        "-q"], check=True)
        print(f"{clients} clients, each a {len(BODY):,}-byte /search it never reads the answer of")
        print("| --max-answer-bytes-in-flight | server RSS before | peak | answered 200 | 503 |")
        print("|---|---|---|---|---|")
        for name, bound in BOUNDS.items():
            base, peak, ok, refused = measure(work / "out", bound, clients, work)
            print(f"| {name} | {base:,.0f} MiB | {peak:,.0f} MiB | {ok} | {refused} |", flush=True)


if __name__ == "__main__":
    main()
