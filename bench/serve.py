"""``petal bench serve``: a real ``petal serve`` child process on loopback under bounded load.

Scenarios: each endpoint (/v1/embeddings, /search) x query length (16, 128 tokens) x concurrency
(1, 16, 64); each runs until its request count or its time limit. Reported per scenario: p50 and
p99 latency, requests/s, and the mean texts per engine step (from the server's /metrics), so the
batching across requests shows.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from petal.bench.corpus import load_sentences
from petal.bench.serve_load import json_bodies, run_load
from petal.pipeline.ingest.tokens import TextTokenizer

ENDPOINTS = {"embeddings": "/v1/embeddings", "search": "/search"}
STARTUP_S = 900
WARMUP_REQUESTS = 20


def exact_length_texts(sentences: list[str], tokenizer: TextTokenizer, tokens: int, count: int,
                       seed: int = 0) -> list[str]:
    """``count`` texts of exactly ``tokens`` tokens (prompt and special tokens included) where words allow,
    cut word by word from joined corpus sentences."""
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(count):
        words: list[str] = []
        while len(words) < tokens * 2:
            words += sentences[int(rng.integers(len(sentences)))].split()
        low, high = 1, len(words)  # the most words whose encoding fits in `tokens`
        while low < high:
            mid = (low + high + 1) // 2
            if len(tokenizer.encode([" ".join(words[:mid])]).token_ids[0]) <= tokens:
                low = mid
            else:
                high = mid - 1
        texts.append(" ".join(words[:low]))
    return texts


def write_docs(sentences: list[str], tokenizer: TextTokenizer, num_docs: int, median_tokens: int, out_dir: Path,
               docs_per_shard: int = 100_000) -> None:
    """``num_docs`` texts (lengths lognormal around ``median_tokens``) in Parquet shards under ``out_dir``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from petal.bench.corpus import lognormal_lengths, make_texts

    lengths = lognormal_lengths(num_docs, median_tokens, 0.5, 8, tokenizer.max_length)
    texts = make_texts(sentences, tokenizer, lengths)
    out_dir.mkdir(parents=True, exist_ok=True)
    for shard, start in enumerate(range(0, num_docs, docs_per_shard)):
        rows = range(start, min(start + docs_per_shard, num_docs))
        pq.write_table(pa.table({"id": pa.array(rows, pa.int64()), "text": texts[rows.start : rows.stop]}),
                       out_dir / f"part-{shard:04d}.parquet", row_group_size=8192)


def build_index(model_dir: Path | None, corpus: Path, num_docs: int | None, workdir: Path, device: str,
                doc_tokens: int = 64) -> Path:
    """An index of ``corpus`` (or of ``num_docs`` texts made from its sentences) built by ``petal index``;
    reused when ``workdir/out`` already holds one."""
    out = workdir / "out"
    if (out / "CURRENT").is_file():
        return out
    source = corpus
    if num_docs is not None:
        from petal.engine.loader import inspect_model

        spec = inspect_model(model_dir)
        tokenizer = TextTokenizer(spec.tokenizer_file, spec.pooling.max_length)
        source = workdir / "docs"
        write_docs(load_sentences(corpus), tokenizer, num_docs, doc_tokens, source)
    cmd = [sys.executable, "-m", "petal.cli.main", "index", str(source), "--out", str(out), "-q", "--device", device]
    if model_dir is not None:
        cmd += ["--model", str(model_dir)]
    subprocess.run(cmd, check=True)
    return out


class ServerProcess:
    """``petal serve`` on 127.0.0.1 (any free port) in a child process."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "serve", "--port", "0",
                                          "--log-level", "warning", *args], stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + STARTUP_S
        while True:
            found = re.search(r"listening on (http://[\d.]+:\d+)", log.read_text(errors="replace"))
            if found:
                self.url = found.group(1)
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"petal serve did not start:\n{log.read_text(errors='replace')[-4000:]}")
            time.sleep(0.2)

    def metrics(self) -> dict[str, float]:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as response:
            text = response.read().decode()
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(petal_batch_\w+_(?:sum|count)) (\S+)$", text,
                                                                    re.M)}

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def _percentile_ms(values: list[float], q: float) -> float | None:
    return round(1000 * float(np.percentile(values, q)), 3) if values else None


def run_serve_bench(index: Path | None = None, model: Path | None = None, corpus: Path = Path("sample_data"),
                    num_docs: int | None = None, doc_tokens: int = 64, workdir: Path | None = None,
                    device: str = "auto",
                    endpoints: tuple[str, ...] = ("embeddings", "search"), tokens: tuple[int, ...] = (16, 128),
                    concurrency: tuple[int, ...] = (1, 16, 64), max_requests: int = 2000, seconds: float = 10.0,
                    k: int = 10, processes: int | None = None, serve_args: tuple[str, ...] = ()) -> dict[str, Any]:
    """Start a server, run every scenario, stop it (SIGTERM; its exit status is reported)."""
    from petal.engine.loader import inspect_model
    from petal.pipeline.ingest.tokens import tokenizer_for

    workdir = Path(workdir or tempfile.mkdtemp(prefix="petal-bench-serve-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if index is None and "search" in endpoints:
        index = build_index(model, corpus, num_docs, workdir, device, doc_tokens)
    args = [str(index)] if index is not None else []
    if model is not None:
        args += ["--model", str(model)]
    args += ["--device", device, *serve_args]
    if index is not None:
        from petal.pipeline.jobs.query import model_for_index
        from petal.pipeline.layout import resolve_index_dir

        spec = model_for_index(resolve_index_dir(index)[1], str(model) if model else None)
    else:
        spec = inspect_model(model)
    counter = tokenizer_for(spec, "query")
    sentences = load_sentences(corpus)
    queries = {n: exact_length_texts(sentences, counter, n, 256, seed=n) for n in tokens}
    procs = processes or max(1, min(8, (os.cpu_count() or 2) // 4))
    server = ServerProcess(args, workdir / "serve.log")
    rows = []
    try:
        for endpoint in endpoints:
            if endpoint == "search" and index is None:
                continue
            path = ENDPOINTS[endpoint]
            for n in tokens:
                key = "input" if endpoint == "embeddings" else "query"
                extra = {"k": k} if endpoint == "search" else {}
                bodies = json_bodies([{key: q, **extra} for q in queries[n]])
                run_load(server.url, path, bodies, 1, WARMUP_REQUESTS, 60.0)
                for c in concurrency:
                    before = server.metrics()
                    load = run_load(server.url, path, bodies, c, max_requests, seconds, processes=procs)
                    after = server.metrics()
                    steps = after.get("petal_batch_texts_count", 0) - before.get("petal_batch_texts_count", 0)
                    texts = after.get("petal_batch_texts_sum", 0) - before.get("petal_batch_texts_sum", 0)
                    done = len(load.latencies_s)
                    rows.append({"endpoint": path, "tokens": n, "concurrency": c, "requests": done,
                                 "errors": load.errors, "seconds": round(load.wall_s, 3),
                                 "p50_ms": _percentile_ms(load.latencies_s, 50),
                                 "p99_ms": _percentile_ms(load.latencies_s, 99),
                                 "requests_per_s": round(done / load.wall_s, 1) if load.wall_s else None,
                                 "texts_per_step": round(texts / steps, 2) if steps else None})
    finally:
        exit_code = server.stop()
    import torch

    from petal.pipeline.serve.settings import model_name

    return {"scenario": "serve", "model": str(spec.path), "model_id": model_name(spec.path),
            "index": str(index) if index else None,
            "device": device, "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "cpu_count": os.cpu_count(), "client_processes": procs, "max_requests": max_requests,
            "seconds_limit": seconds, "k": k, "server_exit_code": exit_code, "results": rows}


def format_serve_table(result: dict[str, Any]) -> str:
    lines = [f"petal serve: {result.get('model_id') or Path(result['model']).name} on {result['cuda'] or 'cpu'}, "
             f"index {result['index'] or '(none)'}; bounds {result['max_requests']} requests / "
             f"{result['seconds_limit']} s per row; {result['client_processes']} client process(es)",
             f"{'endpoint':<16}{'tokens':>7}{'conc':>6}{'requests':>10}{'p50 ms':>10}{'p99 ms':>10}{'req/s':>10}"
             f"{'texts/step':>12}{'errors':>8}"]
    for r in result["results"]:
        fmt = lambda x: "-" if x is None else f"{x:,.2f}"
        lines.append(f"{r['endpoint']:<16}{r['tokens']:>7}{r['concurrency']:>6}{r['requests']:>10}"
                     f"{fmt(r['p50_ms']):>10}{fmt(r['p99_ms']):>10}{fmt(r['requests_per_s']):>10}"
                     f"{fmt(r['texts_per_step']):>12}{sum(r['errors'].values()):>8}")
    lines.append(f"server exit status after SIGTERM: {result['server_exit_code']}")
    return "\n".join(lines)
