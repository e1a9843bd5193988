"""The per-request cost of ``petal serve`` itself: one server in this process (``--model``, embeddings only,
packaged MiniLM by default) and a load-generator child process that reads the server's CPU time from /proc.

    python bench/serve_probe.py --requests 500 --clients 1 [--words 110] [--format base64] [--profile] [--device cuda]

Prints one line: p50/p99, requests/s, and CPU per request of the server's event-loop thread (the main
thread: uvicorn runs the loop there), of the whole server, and of the clients. ``--profile`` adds a
CPU-time profile (``cProfile`` with ``time.thread_time``) of the event-loop thread, by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import time

CLIENT = r"""
import json, os, sys, time
from pathlib import Path
from petal.bench.serve_load import run_load
pid, port, fmt = sys.argv[1], sys.argv[2], sys.argv[5]
n, c, words = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[6])
base = "how do glaciers move in the cold winter".split()
text = " ".join(base[i % len(base)] for i in range(words))
bodies = [json.dumps({"input": text, "encoding_format": fmt, "truncate": True}).encode()]
url = f"http://127.0.0.1:{port}"
time.sleep(2)
run_load(url, "/v1/embeddings", bodies, 1, 20, 5)  # warm
def cpu(stat):
    f = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
loop, proc = f"/proc/{pid}/task/{pid}/stat", f"/proc/{pid}/stat"
a, b = cpu(loop), cpu(proc)
r = run_load(url, "/v1/embeddings", bodies, c, n, 120, processes=min(c, 2))
a, b = cpu(loop) - a, cpu(proc) - b
done = len(r.latencies_s)
lat = sorted(r.latencies_s)
print(f"clients {c} {fmt} {words} words: {done} requests, p50 {lat[done // 2] * 1e3:.2f} ms, "
      f"p99 {lat[int(done * .99)] * 1e3:.2f} ms, "
      f"{done / r.wall_s:.0f} req/s; CPU per request: loop {1e6 * a / done:.0f} us, server {1e6 * b / done:.0f} us, "
      f"client {1e6 * r.client_cpu_s / done:.0f} us; errors {r.errors}", flush=True)
os.kill(int(pid), 15)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--format", choices=["float", "base64"], default="float")
    parser.add_argument("--words", type=int, default=8, help="words per text (8: a short query; 110: ~128 tokens)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()

    from petal.engine.config import ModelOptions
    from petal.pipeline.jobs.index_run import model_spec
    from petal.pipeline.jobs.query import QueryModel, engine_config
    from petal.pipeline.serve.server import bind, serve
    from petal.pipeline.serve.service import ServeState
    from petal.pipeline.serve.settings import ServeSettings
    from petal.pipeline.serve.warmup import warm_up

    spec = model_spec(args.model, None, ModelOptions())
    cuda = args.device == "cuda"
    model = QueryModel(spec, engine_config(spec, args.device, token_budget=8192 if cuda else 2048,
                                           max_seqs=256 if cuda else 64))
    warm_up(model.engine)
    state = ServeState(model, ServeSettings())
    sock = bind("127.0.0.1", 0)
    subprocess.Popen([sys.executable, "-c", CLIENT, str(os.getpid()), str(sock.getsockname()[1]), str(args.requests),
                      str(args.clients), args.format, str(args.words)])
    if not args.profile:
        serve(state, sock)
        return
    profile = cProfile.Profile(time.thread_time)
    profile.runcall(serve, state, sock)
    pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
