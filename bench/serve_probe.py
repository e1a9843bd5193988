"""The per-request cost of ``petal serve`` itself: one server in this process (``--model``, embeddings only,
packaged MiniLM by default) and a load-generator child process that reads the server's CPU time from /proc.

    python bench/serve_probe.py --requests 500 --clients 1 [--words 110] [--format base64] [--profile] [--device cuda]
    python bench/serve_probe.py --compare main [--new REF] --model DIR --torch-threads 1 --clients 1 [--rounds 20]

Prints one line: p50/p99, requests/s, and CPU per request of the server's event-loop thread (the main
thread: uvicorn runs the loop there), of the whole server, and of the clients. ``--profile`` adds a
CPU-time profile (``cProfile`` with ``time.thread_time``) of the event-loop thread, by own time.

``--compare REF``: an A/B of the server's code in one run. Server processes on the git ref ``REF``'s
code (``git archive`` into a temporary folder) and on the working tree's (copied the same way), two of
each, the same model; the load takes turns between them (``--rounds`` blocks of ``--requests`` each, ABBA
order), so the machine's noise falls on both. Per server: p50/p90, the mean engine step (``petal_step_seconds`` of its
``/metrics``, launch to result), p50 minus the step (what the server adds around it), texts per step,
the mean ``Server-Timing`` spans and the CPU per request of its event-loop thread and of the whole
process; then the working tree's over REF's. With a tiny model (``--model``; e.g. ``tiny_model_dir`` of
``bench/lone_request_probe.py``) and ``--torch-threads 1`` the step is short, so the server's share shows.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("petal", "cli", "engine", "pipeline", "bench")  # pyproject's package-dir: petal.<name> = <name>

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


SERVER = r"""
import os, sys
import torch
from petal.engine.config import ModelOptions
from petal.pipeline.jobs.index_run import model_spec
from petal.pipeline.jobs.query import QueryModel, engine_config
from petal.pipeline.serve.server import bind, serve
from petal.pipeline.serve.service import ServeState
from petal.pipeline.serve.settings import ServeSettings
from petal.pipeline.serve.warmup import warm_up
model_dir, device, threads = sys.argv[1] or None, sys.argv[2], int(sys.argv[3])
if threads:
    torch.set_num_threads(threads)
spec = model_spec(model_dir, None, ModelOptions())
cuda = device == "cuda"
model = QueryModel(spec, engine_config(spec, device, token_budget=8192 if cuda else 2048, max_seqs=256 if cuda else 64))
warm_up(model.engine)
sock = bind("127.0.0.1", 0)
print(sock.getsockname()[1], flush=True)
serve(ServeState(model, ServeSettings()), sock)
"""


def export_tree(ref: str | None, out: Path) -> Path:
    """``ref``'s packages (``None``: the working tree's) laid out as installed (``out/root/petal/<name>``),
    for ``PYTHONPATH``: both sides of an A/B are imported the same way (an editable install against an
    exported tree measured ~8% apart in loop CPU on identical code)."""
    src = out / "src"
    if ref is None:
        for name in PACKAGES:
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, *PACKAGES], check=True,
                                 capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(src, filter="data")
    root = out / "root"
    shutil.copytree(src / "petal", root / "petal")
    for name in PACKAGES[1:]:
        (root / "petal" / name).symlink_to(src / name)
    return root


def cpu_s(stat: str) -> float:
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def step_metrics(url: str) -> tuple[float, float, float]:
    """(``petal_step_seconds`` sum, its count, ``petal_batch_texts`` sum) of the server's ``/metrics``."""
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return (float(values["petal_step_seconds_sum"]), float(values["petal_step_seconds_count"]),
            float(values["petal_batch_texts_sum"]))


@dataclass
class Totals:
    """One server's share of a ``--compare`` run."""

    latencies_s: list[float] = field(default_factory=list)
    spans_s: dict[str, float] = field(default_factory=dict)
    loop_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    wall_s: float = 0.0
    steps: np.ndarray = field(default_factory=lambda: np.zeros(3))  # step seconds, steps, texts (/metrics)


def compare(args: argparse.Namespace) -> None:
    from petal.bench.serve_load import run_load

    work = Path(tempfile.mkdtemp(prefix="petal-serve-ab-"))
    servers: list[tuple[str, subprocess.Popen[str], str]] = []  # (label, process, url)
    base = "how do glaciers move in the cold winter".split()
    text = " ".join(base[i % len(base)] for i in range(args.words))
    bodies = [f'{{"input": "{text}", "encoding_format": "{args.format}", "truncate": true}}'.encode()]
    try:
        trees = {args.new or "working tree": str(export_tree(args.new, work / "new")),
                 args.compare: str(export_tree(args.compare, work / "ref"))}
        # NOTE: two servers of each, started new, ref, ref, new: the later-started of two identical servers
        # measured ~3% faster (p50) here, whatever the code; the ABBA start cancels that
        for label in [*trees, *reversed(trees)]:
            env = {**os.environ, "PYTHONPATH": trees[label]}
            child = subprocess.Popen([sys.executable, "-c", SERVER, args.model or "", args.device,
                                      str(args.torch_threads)], cwd=work, env=env, stdout=subprocess.PIPE, text=True)
            assert child.stdout is not None
            servers.append((label, child, f"http://127.0.0.1:{child.stdout.readline().strip()}"))
        totals = {label: Totals() for label in trees}
        for _, _, url in servers:  # warm
            run_load(url, "/v1/embeddings", bodies, args.clients, 200, 60, processes=min(args.clients, 2))
        for r in range(args.rounds):
            for label, child, url in servers if r % 2 == 0 else servers[::-1]:
                t = totals[label]
                loop, proc = f"/proc/{child.pid}/task/{child.pid}/stat", f"/proc/{child.pid}/stat"
                before = (cpu_s(loop), cpu_s(proc), np.array(step_metrics(url)))
                result = run_load(url, "/v1/embeddings", bodies, args.clients, args.requests, 120,
                                  processes=min(args.clients, 2))
                t.steps += np.array(step_metrics(url)) - before[2]
                t.loop_cpu_s += cpu_s(loop) - before[0]
                t.server_cpu_s += cpu_s(proc) - before[1]
                t.latencies_s += result.latencies_s
                t.wall_s += result.wall_s
                for name, seconds in result.span_sums_s.items():
                    t.spans_s[name] = t.spans_s.get(name, 0.0) + seconds
                assert not result.errors, result.errors
        print(f"clients {args.clients}, {args.words} words, {args.format}, {args.rounds} rounds x {args.requests} "
              f"requests a server (two servers of each), turns taken (torch threads {args.torch_threads or 'default'})")
        summary = {}
        for label, t in totals.items():
            ms = np.array(t.latencies_s) * 1e3
            n = len(ms)
            step_ms = 1e3 * t.steps[0] / t.steps[1]
            p50 = float(np.median(ms))
            summary[label] = (p50, p50 - step_ms, 1e6 * t.loop_cpu_s / n, 1e6 * t.server_cpu_s / n, n / t.wall_s)
            spans = " ".join(f"{name} {1e3 * s / n:.3f}" for name, s in t.spans_s.items())
            print(f"  {label:<14} p50 {p50:.3f} ms, p90 {np.percentile(ms, 90):.3f} ms, {n / t.wall_s:.0f} req/s, "
                  f"step {step_ms:.3f} ms, p50 - step {p50 - step_ms:.3f} ms, texts/step "
                  f"{t.steps[2] / t.steps[1]:.1f}; CPU per request: loop {summary[label][2]:.0f} us, server "
                  f"{summary[label][3]:.0f} us; spans (mean ms): {spans}")
        old, new = summary[args.compare], summary[args.new or "working tree"]
        print(f"  {args.new or 'working tree'} / {args.compare}: p50 {new[0] / old[0]:.3f}, "
              f"p50 - step {new[1] / old[1]:.3f}, loop CPU {new[2] / old[2]:.3f}, "
              f"server CPU {new[3] / old[3]:.3f}, req/s {new[4] / old[4]:.3f}")
    finally:
        for _, child, _ in servers:
            child.terminate()
            child.wait()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--format", choices=["float", "base64"], default="float")
    parser.add_argument("--words", type=int, default=8, help="words per text (8: a short query; 110: ~128 tokens)")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--compare", metavar="REF", default=None,
                        help="A/B: a server on git REF's code against one on the working tree's, taking turns")
    parser.add_argument("--new", metavar="REF", default=None, help="--compare: REF's code, not the working tree's")
    parser.add_argument("--rounds", type=int, default=10, help="--compare: blocks of --requests per server")
    parser.add_argument("--torch-threads", type=int, default=0, help="the server's torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.compare:
        compare(args)
        return

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
    order, rows = os.environ.get("PETAL_PROFILE_SORT", "tottime"), int(os.environ.get("PETAL_PROFILE_ROWS", "25"))
    pstats.Stats(profile, stream=sys.stdout).sort_stats(order).print_stats(rows)


if __name__ == "__main__":
    main()
