"""``petal bench serve``'s load generator against a server that hung (it accepts connections and reads requests
but never answers): each client gives up soon after the row's deadline (``LATE_S`` past it), counting the
requests as ``TimeoutError``. Before, a client blocked in ``recv`` for the socket's fixed 120 s, so one hung server
held the row (and the benchmark) two minutes past its time limit. The load runs in a child process (tests do not
import benchmark code: the lazy-import tests watch this process's modules); the child's own limit is what fails."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

SCRIPT = """
import json, sys
from petal.bench import serve_load
serve_load.LATE_S = 1.0
result = serve_load.run_load(sys.argv[1], "/v1/embeddings", [b'{"input": "x"}'], int(sys.argv[2]), 100, 0.5)
print(json.dumps({"errors": result.errors, "answered": len(result.latencies_s)}))
"""


def test_a_hung_server_ends_each_client_after_the_deadline():
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_never_answer() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(conn)  # read nothing back, answer nothing: a server stuck in its handler

    thread = threading.Thread(target=accept_and_never_answer, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        done = subprocess.run([sys.executable, "-c", SCRIPT, url, "3"], capture_output=True, text=True, timeout=60)
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["answered"] == 0
    assert result["errors"] == {"TimeoutError": 3}  # one request a client, each given up, none left waiting
