"""``petal bench serve``'s table keeps a space between any two columns: a value as wide as its column ran into the
next one (``12.8010,012.72``: p50 12.80 and p99 10,012.72 read as one number). The table is formatted in a child
process (tests do not import benchmark code: the lazy-import tests watch this process's modules)."""

from __future__ import annotations

import json
import subprocess
import sys

ROW = {"endpoint": "/v1/embeddings", "tokens": 128, "concurrency": 64, "requests": 123456789, "p50_ms": 12.8,
       "p99_ms": 10012.72, "requests_per_s": 1234567.5, "texts_per_step": 25.4, "step_ms": 11.6,
       "server_p50_ms": 9.1, "loop_cpu_us": 183, "server_cpu_us": 1234567, "client_cpu_us": 98765432,
       "errors": {"503": 12345678}}
RESULT = {"model_id": "m", "model": "/m", "cuda": None, "index": "/i", "max_requests": 2000, "seconds_limit": 10.0,
          "client_processes": 1, "results": [ROW], "server_exit_code": 0}
SCRIPT = ("import json, sys; from petal.bench.serve import format_serve_table; "
          "print(format_serve_table(json.load(sys.stdin)))")


def test_wide_values_stay_apart():
    table = subprocess.run([sys.executable, "-c", SCRIPT], input=json.dumps(RESULT), capture_output=True, text=True,
                           check=True, timeout=300).stdout.splitlines()
    header, row = table[1].split(), table[2].split()
    assert header == ["endpoint", "tokens", "conc", "requests", "p50", "ms", "p99", "ms", "req/s", "texts/step",
                      "step", "ms", "app", "p50", "loop", "µs", "srv", "µs", "cli", "µs", "errors"]
    assert row == ["/v1/embeddings", "128", "64", "123456789", "12.80", "10,012.72", "1,234,567.50", "25.40", "11.60",
                   "9.10", "183", "1,234,567", "98,765,432", "12345678"]
