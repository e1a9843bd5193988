"""``petal serve`` memory when clients send bodies whose parsed form is larger than their bytes: CLIENTS connections at
once, each a ~4 MB ``/v1/embeddings`` body of token ids with ``"truncate": true`` (256 lists of 7,812 ids ``7``: 2
bytes of JSON, 8 bytes parsed), at the default ``--max-body-bytes-in-flight`` (64 MiB). Prints the server's RSS
before, its peak (psutil, every 50 ms) and how many requests were answered 200 and 503. The index: sample_data,
built here with the packaged MiniLM. From the project root (``PYTHONPATH=TREE`` measures another tree):

    python bench/serve_body_memory_probe.py [CLIENTS]   (default 16)
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

IDS_PER_LIST = 4_000_000 // 256 // 2
BODY = ('{"truncate": true, "input": [' + ",".join(["[" + ",".join(["7"] * IDS_PER_LIST) + "]"] * 256)
        + "]}").encode()


def start(out: Path, log: Path) -> tuple[subprocess.Popen[bytes], str, int]:
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "serve", str(out), "--port", "0",
                                 "--log-level", "warning", "--max-body-bytes", str(8 << 20),
                                 "--max-queue-texts", "65536"], stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 120
    while not (found := re.search(r"listening on http://([\d.]+):(\d+)", log.read_text(errors="replace"))):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"petal serve did not start:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)
    return proc, found.group(1), int(found.group(2))


def post(host: str, port: int, statuses: list[int]) -> None:
    with socket.create_connection((host, port), timeout=600) as sock:
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
        head = sock.recv(64)
    statuses.append(int(head.split()[1]))


def main() -> None:
    clients = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-m", "petal.cli.main", "index", "sample_data", "--out", str(work / "out"),
                        "-q"], check=True)
        proc, host, port = start(work / "out", work / "serve.log")
        server = psutil.Process(proc.pid)
        base = peak = server.memory_info().rss
        statuses: list[int] = []
        threads = [threading.Thread(target=post, args=(host, port, statuses)) for _ in range(clients)]
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            peak = max(peak, server.memory_info().rss)
            time.sleep(0.05)
        proc.terminate()
        proc.wait(60)
    print(f"{clients} clients, each a {len(BODY):,}-byte body of token ids with truncate")
    print(f"server RSS before {base / 2**20:,.0f} MiB, peak {peak / 2**20:,.0f} MiB; "
          f"answered 200: {statuses.count(200)}, 503: {statuses.count(503)}, other: "
          f"{len(statuses) - statuses.count(200) - statuses.count(503)}")


if __name__ == "__main__":
    main()
