"""``petal bench serve``: a real ``petal serve`` child process on loopback under bounded load.

Scenarios: each endpoint (/v1/embeddings, /search) x query length (16, 128 tokens) x concurrency
(1, 16, 64); each runs until its request count or its time limit. Reported per scenario: p50 and
p99 latency, requests/s, and the mean texts per engine step (from the server's /metrics), so the
batching across requests shows.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from petal.bench.corpus import load_sentences
from petal.bench.runs import ChildFailed, temporary_workdir
from petal.bench.serve_load import json_bodies, run_load, slowest
from petal.bench.workdir import Written
from petal.pipeline.ingest.tokens import TextTokenizer
from petal.pipeline.reliability.errors import TemporaryFailure, quote_path

ENDPOINTS = {"embeddings": "/v1/embeddings", "search": "/search"}
STARTUP_S = 900
GONE_WAIT_S = 35  # a server that refuses connections: how long to wait for its exit (a drain: 30 s by default)
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
    written = Written(out_dir)
    # NOTE: an earlier (or stopped) run's shards: not this corpus. Only those it recorded are removed (was: every
    # part-*.parquet there, a user's too); anything else there would be indexed with them: refused, left as it is
    for stale in written.names():
        written.remove(stale)
    written.check(*(entry.name for entry in out_dir.iterdir() if not entry.name.startswith(".petal-bench.")))
    for shard, start in enumerate(range(0, num_docs, docs_per_shard)):
        rows = range(start, min(start + docs_per_shard, num_docs))
        pq.write_table(pa.table({"id": pa.array(rows, pa.int64()), "text": texts[rows.start : rows.stop]}),
                       written.claim(f"part-{shard:04d}.parquet"), row_group_size=8192)


def build_index(model_dir: Path | None, corpus: Path, num_docs: int | None, workdir: Path, device: str,
                doc_tokens: int = 64) -> Path:
    """An index of ``corpus`` (or of ``num_docs`` texts made from its sentences) built by ``petal index``;
    reused when ``workdir/out`` already holds one."""
    written = Written(workdir)
    out = workdir / "out"
    built = workdir / "built.json"
    asked = {"corpus": str(corpus.resolve()), "index_docs": num_docs,
             "index_doc_tokens": doc_tokens if num_docs is not None else None,
             "model": str(model_dir.resolve()) if model_dir is not None else None}
    # NOTE: a user's index (or file) there is never petal bench's to serve or remove (was: removed, rebuilt)
    written.check("out", "built.json")
    if (out / "CURRENT").is_file():
        try:
            recorded = json.loads(built.read_text())
        except (OSError, ValueError):
            recorded = None
        if recorded == asked:
            return out
        # NOTE: an index built for other flags (another --index-docs, corpus or model, or by a run before this
        # record): it was served whatever the flags asked, the table not saying so; rebuilt
        print(f"petal bench serve: {quote_path(out)} was built for other settings ({recorded or 'not recorded'}); "
              "building it again", file=sys.stderr)
    for name in ("built.json", "out"):
        if name in written.names():
            written.remove(name)
    written.claim("out")
    source = corpus
    if num_docs is not None:
        from petal.engine.loader import inspect_model

        spec = inspect_model(model_dir)
        tokenizer = TextTokenizer(spec.tokenizer_file, spec.pooling.max_length)
        source = written.claim("docs")
        write_docs(load_sentences(corpus), tokenizer, num_docs, doc_tokens, source)
    cmd = [sys.executable, "-m", "petal.cli.main", "index", str(source), "--out", str(out), "-q", "--device", device]
    if model_dir is not None:
        cmd += ["--model", str(model_dir)]
    code = subprocess.run(cmd).returncode  # its stderr is the benchmark's: its error is said there
    if code:
        raise ChildFailed(f"petal index of the benchmark's documents ({quote_path(source)})", code,
                          where="its error is above")
    written.claim("built.json").write_text(json.dumps(asked))
    return out


class ServerProcess:
    """``petal serve`` on 127.0.0.1 (any free port) in a child process."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "serve", "--port", "0",
                                          "--log-level", "warning", *args], stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + STARTUP_S
        try:  # NOTE: a stop signal while it starts (a model loads for minutes) stops it too: was left running
            while True:
                found = re.search(r"listening on (http://\S+:\d+)", log.read_text(errors="replace"))  # an IPv6 one too
                if found:
                    self.url = found.group(1)
                    return
                self.alive()  # NOTE: an exit was a RuntimeError traceback (exit 1) whatever the server said
                if time.monotonic() > deadline:
                    raise TemporaryFailure(f"petal serve did not listen within {STARTUP_S} s")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise

    def alive(self) -> None:
        """``ChildFailed`` when the server has exited (its code and the last line of its log)."""
        code = self.proc.poll()
        if code is not None:
            raise ChildFailed("petal serve", code, self.log.read_text(errors="replace"))

    def metrics(self) -> dict[str, float]:
        import urllib.request

        self.alive()  # NOTE: a server gone under load (killed, crashed) was an I/O error (74) or a traceback
        try:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as response:
                text = response.read().decode()
        except OSError:
            # NOTE: gone meanwhile: said as such once it has exited. A server stopped by SIGTERM refuses connections
            # while it drains, then exits: 0.5 s of waiting was too short under load (the bench said 'cannot read a
            # file', 65, not that the server stopped)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(GONE_WAIT_S)
            self.alive()
            raise
        out = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(petal_(?:batch|step)_\w+_(?:sum|count)) (\S+)$",
                                                                   text, re.M)}
        # the server process's garbage collections: time in them, the full ones (generation 2), and the longest
        # pause since the server became ready
        gc = [(name, generation, float(value)) for name, generation, value in re.findall(
            r'^petal_gc_(collections_total|seconds_total|longest_pause_seconds)\{generation="(\d)"\} (\S+)$', text,
            re.M)]
        out["gc_s"] = sum(v for name, _, v in gc if name == "seconds_total")
        out.update({f"gc_full_{name}": v for name, g, v in gc if g == "2" and name != "longest_pause_seconds"})
        out["gc_longest_s"] = max((v for name, _, v in gc if name == "longest_pause_seconds"), default=0.0)
        out.update(self.cpu_seconds())
        return out

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time of the server so far: its main thread (the event loop: uvicorn runs it there) and the whole
        process (Linux /proc; empty elsewhere)."""
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        out = {}
        for name, stat in (("loop_cpu_s", f"/proc/{self.proc.pid}/task/{self.proc.pid}/stat"),
                           ("server_cpu_s", f"/proc/{self.proc.pid}/stat")):
            try:
                fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[name] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime (fields 14, 15 of stat)
        return out

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 60 s or when the wait is interrupted (a second Ctrl-C): never left running."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                return self.proc.wait(60)
            except BaseException as exc:
                self.proc.kill()
                self.proc.wait()
                if not isinstance(exc, subprocess.TimeoutExpired):
                    raise
        return self.proc.wait()


def _per_request_us(delta: dict[str, float], key: str, requests: int) -> float | None:
    return round(1e6 * delta[key] / requests, 1) if requests and key in delta else None


def _percentile_ms(values: list[float], q: float) -> float | None:
    return round(1000 * float(np.percentile(values, q)), 3) if values else None


def run_serve_bench(index: Path | None = None, model: Path | None = None, corpus: Path = Path("sample_data"),
                    num_docs: int | None = None, doc_tokens: int = 64, workdir: Path | None = None,
                    device: str = "auto",
                    endpoints: tuple[str, ...] = ("embeddings", "search"), tokens: tuple[int, ...] = (16, 128),
                    concurrency: tuple[int, ...] = (1, 16, 64), max_requests: int = 2000, seconds: float = 10.0,
                    k: int = 10, processes: int | None = None, serve_args: tuple[str, ...] = ()) -> dict[str, Any]:
    """Start a server, run every scenario, stop it (SIGTERM; its exit status is reported). Without
    ``workdir``, the index and the server log go to a temporary directory, removed at the end."""
    from petal.engine.loader import inspect_model
    from petal.pipeline.ingest.tokens import tokenizer_for

    if workdir is None:  # NOTE: was left behind (the index, its documents and the server's log)
        with temporary_workdir("petal-bench-serve-") as temporary:
            return run_serve_bench(index, model, corpus, num_docs, doc_tokens, temporary, device, endpoints, tokens,
                                   concurrency, max_requests, seconds, k, processes, serve_args)
    workdir.mkdir(parents=True, exist_ok=True)
    if index is None and "search" in endpoints:
        index = build_index(model, corpus, num_docs, workdir, device, doc_tokens)
    if index is None and model is None:  # NOTE: petal serve needs OUT or --model (was: exit 2 'give OUT ...')
        from petal.engine.loader import default_model_dir

        model = default_model_dir()
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
    server = ServerProcess(args, Written(workdir).claim("serve.log"))
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
                    delta = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
                    answered = done + sum(load.errors.values())
                    step_count = delta.get("petal_step_seconds_count", 0)
                    rows.append({"endpoint": path, "tokens": n, "concurrency": c, "requests": done,
                                 "errors": load.errors, "seconds": round(load.wall_s, 3),
                                 "p50_ms": _percentile_ms(load.latencies_s, 50),
                                 "p99_ms": _percentile_ms(load.latencies_s, 99),
                                 "requests_per_s": round(done / load.wall_s, 1) if load.wall_s else None,
                                 "texts_per_step": round(texts / steps, 2) if steps else None,
                                 # the engine step (launch to result), mean: what a lone request cannot avoid
                                 "step_ms": round(1000 * delta["petal_step_seconds_sum"] / step_count, 3)
                                 if step_count else None,
                                 # CPU per answered request: the server's event-loop thread, the whole server, the
                                 # load generator's client threads (to tell a client bottleneck apart)
                                 "loop_cpu_us": _per_request_us(delta, "loop_cpu_s", answered),
                                 "server_cpu_us": _per_request_us(delta, "server_cpu_s", answered),
                                 "client_cpu_us": round(1e6 * load.client_cpu_s / answered, 1) if answered else None,
                                 # the server's own time (Server-Timing "app": handler start to response built)
                                 # and its spans, mean ms per answer: the rest of p50 is HTTP, loopback, client
                                 "server_p50_ms": _percentile_ms(load.server_s, 50),
                                 "server_p99_ms": _percentile_ms(load.server_s, 99),
                                 # the server's garbage collections during the row: their time, and the longest
                                 # pause if one longer than any before came in this row
                                 "gc_ms": round(1000 * delta.get("gc_s", 0.0), 3),
                                 "gc_full": int(delta.get("gc_full_collections_total", 0)),
                                 "gc_full_ms": round(1000 * delta.get("gc_full_seconds_total", 0.0), 3),
                                 "gc_longest_ms": round(1000 * after["gc_longest_s"], 3)
                                 if after.get("gc_longest_s", 0.0) > before.get("gc_longest_s", 0.0) else None,
                                 "spans_ms": {name: round(1000 * total / done, 3)
                                              for name, total in load.span_sums_s.items()} if done else {},
                                 # the slowest 1%: where their time went, and whether they came together
                                 "slowest": slowest(load.answers)})
    finally:
        exit_code = server.stop()
    import torch

    from petal.pipeline.serve.settings import model_name

    return {"scenario": "serve", "model": str(spec.path), "model_id": model_name(spec.path),
            "index": str(index) if index else None,
            "device": device, "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "cpu_count": os.cpu_count(), "client_processes": procs, "max_requests": max_requests,
            "seconds_limit": seconds, "k": k, "server_exit_code": exit_code, "results": rows}


SERVE_COLUMNS = (15, 6, 5, 9, 9, 9, 9, 11, 8, 8, 8, 8, 8, 7)  # widths; a space before each column but the first


def _cells(values: list[Any], widths: tuple[int, ...] = SERVE_COLUMNS) -> str:
    """One table line: the first value left-aligned, the others right-aligned, one space at least between any two
    (a value wider than its column ran into the next one: '12.8010,012.72')."""
    first, *rest = values
    return f"{first!s:<{widths[0]}}" + "".join(f" {v!s:>{w}}" for v, w in zip(rest, widths[1:]))


def format_serve_table(result: dict[str, Any]) -> str:
    lines = [f"petal serve: {result.get('model_id') or Path(result['model']).name} on {result['cuda'] or 'cpu'}, "
             f"index {result['index'] or '(none)'}; bounds {result['max_requests']} requests / "
             f"{result['seconds_limit']} s per row; {result['client_processes']} client process(es)",
             _cells(["endpoint", "tokens", "conc", "requests", "p50 ms", "p99 ms", "req/s", "texts/step", "step ms",
                     "app p50", "loop µs", "srv µs", "cli µs", "errors"])]
    for r in result["results"]:
        fmt = lambda x: "-" if x is None else f"{x:,.2f}"
        fmt0 = lambda x: "-" if x is None else f"{x:,.0f}"
        lines.append(_cells([r["endpoint"], r["tokens"], r["concurrency"], r["requests"], fmt(r["p50_ms"]),
                             fmt(r["p99_ms"]), fmt(r["requests_per_s"]), fmt(r["texts_per_step"]),
                             fmt(r.get("step_ms")), fmt(r.get("server_p50_ms")), fmt0(r.get("loop_cpu_us")),
                             fmt0(r.get("server_cpu_us")), fmt0(r.get("client_cpu_us")), sum(r["errors"].values())]))
    lines.append("step ms: mean engine step (server); app p50: the server's own time (Server-Timing); loop/srv/cli "
                 "µs: CPU per request of the server's event-loop thread, the whole server, the load generator")
    for r in result["results"]:
        if r.get("spans_ms"):
            spans = " ".join(f"{k} {v:.3f}" for k, v in r["spans_ms"].items())
            tail = f"; app p99 {r['server_p99_ms']:.2f}" if r.get("server_p99_ms") is not None else ""
            if r.get("gc_ms") is not None:
                tail += f"; gc {r['gc_ms']:.1f} ms, {r.get('gc_full', 0)} full ({r.get('gc_full_ms', 0.0):.1f} ms)"
                tail += f" (a new longest pause: {r['gc_longest_ms']:.1f} ms)" if r.get("gc_longest_ms") else ""
            lines.append(f"  spans ms (mean) {r['endpoint']} {r['tokens']} tok c{r['concurrency']}: {spans}{tail}")
            slow = r.get("slowest")
            if slow and slow.get("spans_ms"):
                spans = " ".join(f"{k} {v:.2f}" for k, v in slow["spans_ms"].items())
                lines.append(f"    slowest {slow['count']}: {slow['latency_ms']:.2f} ms: {spans}; sent within "
                             f"{slow['sent_within_ms']:.0f} ms")
    lines.append(f"server exit status after SIGTERM: {result['server_exit_code']}")
    return "\n".join(lines)


def _row(result: dict[str, Any], endpoint: str, tokens: int, concurrency: int) -> dict[str, Any] | None:
    return next((r for r in result["results"] if (r["endpoint"], r["tokens"], r["concurrency"]) ==
                 (endpoint, tokens, concurrency)), None)


def format_targets(result: dict[str, Any], t2_tok_s: float | None = None, l1_ms: float | None = None) -> str:
    """Issue 13's H200 targets against this run. L1: ``l1_ms`` (the offline ``petal bench gpu`` L1 of one
    128-token query) when given, else the server's own mean engine step in the 1-client 128-token row;
    T2: ``t2_tok_s`` (offline ``petal bench gpu`` T2), when given."""
    lines = [f"{'scenario':<48}{'target':>22}{'measured':>14}  met"]

    def add(name: str, target: str, value: float | None, ok: bool | None) -> None:
        shown = "-" if value is None else f"{value:,.2f}"
        lines.append(f"{name:<48}{target:>22}{shown:>14}  {'-' if ok is None else ('yes' if ok else 'NO')}")

    lone = _row(result, "/v1/embeddings", 128, 1)
    step = lone.get("step_ms") if lone else None
    l1 = l1_ms if l1_ms is not None else step
    p50 = lone["p50_ms"] if lone else None
    add("128-token embedding, 1 client, p50 ms", "<= L1 + 0.3" + (f" = {l1 + 0.3:.2f}" if l1 else ""), p50,
        None if p50 is None or l1 is None else p50 <= l1 + 0.3)
    sixteen = _row(result, "/v1/embeddings", 128, 16)
    p99 = sixteen["p99_ms"] if sixteen else None
    add("128-token embedding, 16 clients, p99 ms", "<= 10", p99, None if p99 is None else p99 <= 10)
    for tokens in (16, 128):
        search = _row(result, "/search", tokens, 1)
        p50 = search["p50_ms"] if search else None
        add(f"/search ({tokens}-token query), 1 client, p50 ms", "<= 3", p50, None if p50 is None else p50 <= 3)
    wide = _row(result, "/v1/embeddings", 128, 64)
    tok_s = wide["requests_per_s"] * 128 if wide and wide["requests_per_s"] else None
    add("128-token embeddings at 64 clients, tok/s", ">= 0.7 T2" + (f" = {0.7 * t2_tok_s:,.0f}" if t2_tok_s else ""),
        tok_s, None if tok_s is None or not t2_tok_s else tok_s >= 0.7 * t2_tok_s)
    lines.append(f"L1 used: {l1 if l1 is not None else '-'} ms ({'given' if l1_ms is not None else 'server step'}; "
                 f"server step in that row: {step} ms); T2 used: {t2_tok_s or '-'} tok/s")
    return "\n".join(lines)
