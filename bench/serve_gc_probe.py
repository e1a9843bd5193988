"""What a full garbage collection of ``petal serve`` walks: a real server of OUT in this process (a thread), then
requests of every kind and LONE lone embedding requests of sample sentences; printed after each stage: the objects
left unfrozen (what a full collection walks), the modules imported after the server's freeze, and the time of one
full collection.

From the project root: ``python3 bench/serve_gc_probe.py OUT [LONE]`` (OUT: an index of the packaged model with a
kept ``topic`` column: ``petal index sample_data --out OUT --keep-columns topic``; LONE default 1500). README
"Serving", garbage collection.
"""

from __future__ import annotations

import collections
import gc
import json
import random
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq

import petal.cli.serve as serve_cli
from petal.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    out, lone = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1500
    # NOTE: read before the server starts (and not by pq.read_table, which imports pandas): what this probe imports
    # is not the server's
    words = " ".join(t for f in sorted((ROOT / "sample_data").glob("*.parquet"))
                     for t in pq.ParquetFile(f).read(columns=["text"]).column("text").to_pylist() if t).split()
    at_freeze: dict[str, set[str]] = {}
    real_freeze = serve_cli.freeze_long_lived

    def freeze() -> None:
        real_freeze()
        at_freeze["modules"] = set(sys.modules)

    serve_cli.freeze_long_lived = freeze
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"

    def call(path: str, body: dict | None = None) -> int:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                answer.read()
                return answer.status
        except OSError:
            return 0

    threading.Thread(target=lambda: cli.main(["serve", out, "--port", str(port)], standalone_mode=False),
                     daemon=True).start()
    while call("/ready") != 200:
        time.sleep(0.05)

    def report(stage: str) -> None:
        gc.collect(1)
        left = gc.get_objects()
        kinds = collections.Counter(type(o).__name__ for o in left).most_common(5)
        del left
        started = time.perf_counter()
        gc.collect()
        full_ms = (time.perf_counter() - started) * 1000
        imported = sorted(set(sys.modules) - at_freeze["modules"])
        print(f"{stage}: {len(gc.get_objects()):,} objects unfrozen ({gc.get_freeze_count():,} frozen), a full "
              f"collection {full_ms:.2f} ms; modules imported after the freeze: {len(imported)} {imported[:8]}; "
              f"most common: {kinds}", flush=True)

    for _ in range(20):
        call("/v1/embeddings", {"input": ["glaciers move", "a second text"]})
        call("/search", {"query": "how do glaciers move", "k": 5, "include": ["text", "metadata"]})
        call("/search", {"queries": ["coffee", "rivers"], "k": 3, "where": "topic IN ('science', 'food')"})
        call("/metrics")
    report("requests of every kind")
    rng = random.Random(0)
    for i in range(lone):
        text = " ".join(rng.choice(words) for _ in range(20)) + f" w{i}x{rng.randrange(10**6)}"
        call("/v1/embeddings", {"input": text})
    report(f"then {lone} lone embeddings")


if __name__ == "__main__":
    main()
    import os

    os._exit(0)  # NOTE: the server's threads still run (no signal stops a server outside the main thread)
