"""Run by tests/test_serve_frozen_modules.py in a fresh interpreter: ``petal serve OUT`` in this process (a thread),
requests of every kind, then one JSON line: their statuses and the modules imported after the server froze what
lives as long as the process (``freeze_long_lived``). ``python -m tests._serve_frozen_child OUT MODE [FLAG...]``,
MODE ``text`` (an index of the packaged model, a kept ``topic`` column) or ``vectors`` (``--vectors-column`` of
``DIM`` values, a kept ``topic`` column)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import petal.cli.serve as serve_cli
from petal.cli.main import cli

DIM = 8


def main() -> None:
    out, mode, *flags = sys.argv[1:]
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

    def run() -> None:
        with contextlib.suppress(SystemExit):
            cli.main(["serve", out, "--port", str(port), *flags], standalone_mode=False)

    def call(path: str, body: dict | None = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()
        except OSError:
            return 0, b""

    threading.Thread(target=run, daemon=True).start()
    deadline = time.monotonic() + 120
    while call("/ready")[0] != 200:
        assert time.monotonic() < deadline, "the server never became ready"
        time.sleep(0.05)
    where = "topic IN ('1', '2', 'science')"
    if mode == "text":
        statuses = [
            call("/v1/embeddings", {"input": ["glaciers move", "a second text"]})[0],
            call("/v1/embeddings", {"input": "one text alone", "encoding_format": "base64", "dimensions": 128})[0],
            call("/v1/embeddings", {"input": [[101, 7592, 102]]})[0],
            call("/search", {"query": "how do glaciers move", "k": 5, "include": ["text", "metadata"]})[0],
            call("/search", {"queries": ["coffee", "rivers"], "k": 3, "where": where, "include": ["text"]})[0],
        ]
        vector = json.loads(call("/v1/embeddings", {"input": "glaciers"})[1])["data"][0]["embedding"]
    else:
        statuses = []
        vector = [0.5] * DIM
    statuses += [
        call("/search", {"vectors": [vector], "k": 2})[0],
        call("/search", {"vectors": [vector, vector], "k": 3, "where": where, "include": ["metadata", "text"]})[0],
        call("/search", {"vectors": [vector], "k": 0})[0],
        call("/v1/models")[0], call("/metrics")[0], call("/health")[0], call("/ready")[0],
    ]
    print(json.dumps({"statuses": statuses, "after_freeze": sorted(set(sys.modules) - at_freeze["modules"])}),
          flush=True)
    # NOTE: the server's threads are still running (no signal stops a server outside the main thread): a normal
    # interpreter exit under them can crash while torch's threads wind down
    os._exit(0)


if __name__ == "__main__":
    main()
