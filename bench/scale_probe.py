"""Scaling of `petal index` end to end: one corpus, one model dir, one run per variant.

python3 bench/scale_probe.py SHAPE DOCS TOKENIZER_DIR [in-process] 1 2 [4 8] [1x2]   (GPU host; bench/gpu.sh scale)

A variant is ``in-process`` (no worker processes), ``N`` (``--devices N``: one worker per GPU) or ``NxW``
(``--devices N --workers W``: W worker processes round-robin over N GPUs; ``1x2`` is two workers sharing
GPU 0, each with its own engine and tokenizer: does the tokenization side scale?). Each line: wall time,
the whole run's tok/s, the embed phase's tok/s, and where the embed loops waited (on tokens: the CPU
side was behind; on the device: the GPU was); then the ratios against in-process and ``--devices 1``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from petal.bench.corpus import load_sentences
from petal.bench.e2e import write_corpus
from petal.bench.shapes import hf_model, save_model_dir, shape
from petal.engine.loader import inspect_model
from petal.pipeline.ingest.tokens import TextTokenizer


def main() -> None:
    name, num_docs, tok_dir = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    variants = sys.argv[4:] or ["in-process", "1", "2"]
    work = Path(tempfile.mkdtemp(prefix="petal-scale-"))
    s = shape(name)
    hf = hf_model(s, torch.device("cpu"), torch.float32)
    model_dir = save_model_dir(s, hf, tok_dir, work / "model")
    del hf
    spec = inspect_model(model_dir)
    tokenizer = TextTokenizer(spec.tokenizer_file, spec.pooling.max_length)
    _, tokens = write_corpus(load_sentences(Path("sample_data")), tokenizer, num_docs, work / "corpus", num_shards=16)
    print(f"corpus: {num_docs} docs, {tokens} tokens, {len(list((work / 'corpus').glob('*.parquet')))} shards",
          flush=True)
    rows = []
    for number, variant in enumerate(variants):
        out, report_file = work / f"out-{number}", work / f"report-{number}.json"
        argv = [sys.executable, "-m", "petal.cli.main", "index", str(work / "corpus"), "--out", str(out),
                "--model", str(model_dir), "--json-report", str(report_file), "-q"]
        if variant != "in-process":
            devices, _, workers = variant.partition("x")
            argv += ["--devices", devices] + (["--workers", workers] if workers else [])
        started = time.perf_counter()
        run = subprocess.run(argv, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if run.returncode != 0:
            print(f"{variant}: exit {run.returncode}\n{run.stderr[-3000:]}", flush=True)
            continue
        report = json.loads(report_file.read_text())
        rows.append((variant, wall, report))
        embed = (report.get("throughput") or {}).get("tokens_per_s") or 0.0
        print(f"{variant:>10}: wall {wall:6.1f}s  whole {tokens / wall / 1e3:7.0f}k tok/s  "
              f"embed {embed / 1e3:7.0f}k tok/s  {_waits(report)}  timings {report.get('timings_s')}", flush=True)
    _ratios(rows)
    base = next((wall for variant, wall, _ in rows if variant == "1"), None)
    for variant, wall, _ in rows:
        if base and variant not in ("in-process", "1") and variant.isdigit():
            n = int(variant)
            print(f"efficiency at {n}: {base / (n * wall):.3f}", flush=True)
        if variant == "1":
            ref = next((w for v, w, _ in rows if v == "in-process"), None)
            if ref:
                print(f"--devices 1 vs in-process: {wall / ref - 1:+.1%} wall time", flush=True)


def _waits(report: dict) -> str:
    """Seconds the embed loops blocked on tokens and on the device (summed over the workers)."""
    workers = report.get("workers") or [{"timings_s": report.get("timings_s", {})}]
    tokens = sum(w.get("timings_s", {}).get("embed_wait_tokens", 0.0) for w in workers)
    device = sum(w.get("timings_s", {}).get("embed_wait_device", 0.0) for w in workers)
    return f"waited tokens {tokens:5.1f}s device {device:5.1f}s ({len(workers)} loop(s))"


def _ratios(rows: list[tuple[str, float, dict]]) -> None:
    """Wall time and embed tok/s of every variant against in-process and against ``--devices 1``."""
    def embed(report: dict) -> float:
        return float((report.get("throughput") or {}).get("tokens_per_s") or 0.0)

    for ref_name in ("in-process", "1"):
        ref = next(((w, r) for v, w, r in rows if v == ref_name), None)
        if ref is None:
            continue
        for variant, wall, report in rows:
            if variant == ref_name:
                continue
            ratio = embed(report) / embed(ref[1]) if embed(ref[1]) else float("nan")
            print(f"{variant:>10} vs {ref_name}: wall {wall / ref[0] - 1:+.1%}, embed tok/s x{ratio:.3f}", flush=True)


if __name__ == "__main__":
    main()
