"""E2E scenario: Parquet on disk -> FAISS index on disk, real tokenization, counted from the call
that starts the pipeline to the published index.

Baselines in the same process: sentence-transformers ``encode()`` (fp16 on CUDA, its default
batching) + ``IndexFlatIP``; and tokenizer-only throughput (read the same Parquet, tokenize every
text the way the pipeline does, nothing else): the pipeline is doing well when it runs close to it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petal.bench.corpus import load_sentences, lognormal_lengths, make_texts
from petal.bench.runs import temporary_workdir
from petal.pipeline.ingest.tokens import TextTokenizer


def write_corpus(sentences: list[str], tokenizer: TextTokenizer, num_docs: int, out_dir: Path,
                 num_shards: int = 8, seed: int = 0) -> tuple[list[Path], int]:
    """``num_docs`` texts with T2 lengths in ``num_shards`` Parquet files; returns paths and token count."""
    lengths = lognormal_lengths(num_docs, 150, 0.8, 8, 512, seed=seed)
    texts = make_texts(sentences, tokenizer, lengths, seed=seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for shard, rows in enumerate(np.array_split(np.arange(num_docs), num_shards)):
        path = out_dir / f"part-{shard:03d}.parquet"
        pq.write_table(pa.table({"id": pa.array(rows, pa.int64()), "text": [texts[i] for i in rows]}), path,
                       row_group_size=8192)
        paths.append(path)
    tokens = sum(len(ids) for ids in tokenizer.encode(texts).token_ids)
    return paths, tokens


def tokenizer_only(paths: list[Path], tokenizer: TextTokenizer, batch_rows: int = 4096) -> float:
    """Seconds to read every text and tokenize it (the pipeline's stages [1]-[2] alone)."""
    started = time.perf_counter()
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows, columns=["text"]):
            tokenizer.encode(batch.column(0).to_pylist())
    return time.perf_counter() - started


def sentence_transformers_e2e(paths: list[Path], model_dir: Path, device: str, out: Path) -> float:
    """Read all texts, ``encode()`` them, add to an exact FAISS index and write it."""
    import faiss
    import torch
    from sentence_transformers import SentenceTransformer

    started = time.perf_counter()
    model = SentenceTransformer(str(model_dir), device=device)
    if device == "cuda":
        model = model.half()
    texts = [t for p in paths for t in pq.read_table(p, columns=["text"]).column(0).to_pylist()]
    vectors = model.encode(texts, convert_to_numpy=True, normalize_embeddings=False).astype(np.float32)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(out))
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def run_e2e_bench(model_dir: Path, corpus: Path, num_docs: int, device: str, token_budget: int | None = None,
                  baseline: bool = True, workdir: Path | None = None,
                  tokenize_workers: list[int] | tuple[int, ...] = (2,), scale: Any = None,
                  index_factory: str = "Flat", engine_t2: bool = False,
                  engine_t2_tokens_per_s: float | None = None) -> dict[str, Any]:
    """petal vs tokenizer-only (and sentence-transformers) on one corpus. One petal run per value of
    ``tokenize_workers``, each right after a tokenizer-only run (the pair gives its ratio); the
    top-level figures are the first run's: the process's first run, so it pays the cold start
    (CUDA context, kernel loading and compilation); later runs show the warm pipeline.

    ``engine_t2``: also the engine alone on T2 lengths (``petal bench gpu --scenario t2``'s measure,
    same model, same process), so the embed phase and the whole run read as fractions of it;
    ``engine_t2_tokens_per_s``: that figure from an earlier call (not measured again)."""
    from petal.engine.loader import inspect_model
    from petal.pipeline.config import IndexJob, IndexSettings, ReadConfig
    from petal.pipeline.jobs.index_run import run_index
    from petal.pipeline.jobs.report import RunReport

    if workdir is None:  # NOTE: a temporary one, removed at the end (was left behind: the corpus, every index)
        with temporary_workdir("petal-e2e-") as temporary:
            return run_e2e_bench(model_dir, corpus, num_docs, device, token_budget, baseline, temporary,
                                 tokenize_workers, scale, index_factory, engine_t2, engine_t2_tokens_per_s)
    spec = inspect_model(model_dir)
    tokenizer = TextTokenizer(spec.tokenizer_file, spec.pooling.max_length)
    work = Path(workdir)
    paths, tokens = write_corpus(load_sentences(corpus), tokenizer, num_docs, work / "corpus")
    engine_tokens_per_s = engine_t2_tokens_per_s or (engine_t2_throughput(spec, device, token_budget)
                                                     if engine_t2 else None)

    runs = []
    for number, workers in enumerate(tokenize_workers):
        tokenize_s = tokenizer_only(paths, tokenizer)
        job = IndexJob(sources=(str(work / "corpus"),), out=work / f"petal-out-{number}", model=str(model_dir),
                       read=ReadConfig(), index=IndexSettings(factory=index_factory), device=device,
                       token_budget=token_budget, quiet=True, tokenize_workers=workers, scale=scale)
        started = time.perf_counter()
        report = run_index(job, RunReport())
        petal_s = time.perf_counter() - started
        embed_s = report.timings_s.get("embed") or petal_s
        runs.append({"tokenize_workers": workers, "scale": _scale_label(scale),
                     "embed_phase_tokens_per_s": tokens / embed_s,
                     "tokenizer_only_tokens_per_s": tokens / tokenize_s,
                     "petal_tokens_per_s": tokens / petal_s, "petal_seconds": petal_s,
                     "fraction_of_tokenizer_only": tokenize_s / petal_s, "petal_report": report.as_dict()})
    result: dict[str, Any] = {
        "scenario": "e2e", "model": str(model_dir), "device": device, "docs": num_docs, "tokens": tokens,
        "cpu_count": os.cpu_count(), **runs[0], "runs": runs,
    }
    if engine_tokens_per_s is not None:
        result["engine_t2_tokens_per_s"] = engine_tokens_per_s
    if baseline:
        st_s = sentence_transformers_e2e(paths, model_dir, device, work / "st.faiss")
        result["sentence_transformers_tokens_per_s"] = tokens / st_s
        result["ratio_vs_sentence_transformers"] = st_s / result["petal_seconds"]
    return result


def engine_t2_throughput(spec: Any, device: str, token_budget: int | None, num_docs: int = 8192) -> float:
    """Tokens/s of the engine alone on T2 lengths (PERFORMANCE.md), best of two passes after a warm-up."""
    import torch

    from petal.bench.corpus import lognormal_lengths
    from petal.bench.gpu import petal_throughput, random_docs
    from petal.engine.config import EngineConfig
    from petal.engine.engine import Engine, resolve_dtype
    from petal.pipeline.config import default_token_budget

    budget = token_budget or default_token_budget(device, spec.pooling.max_length)
    # (device is a plain str from the CLI here; EngineConfig types it as the DeviceName literal)
    engine = Engine(spec, EngineConfig(device=device, dtype=resolve_dtype("auto", device),  # type: ignore[arg-type]
                                       token_budget=budget))
    docs = random_docs(lognormal_lengths(num_docs, 150, 0.8, 8, min(512, spec.pooling.max_length), seed=0),
                       spec.config.vocab_size, seed=2)
    petal_throughput(engine, docs[: num_docs // 8])  # every bucket: eager, capture
    tokens = sum(len(d) for d in docs)
    best = max(tokens / petal_throughput(engine, docs)[0] for _ in range(2))
    del engine
    if device == "cuda":
        torch.cuda.empty_cache()
    return best


# the run report's timings that nothing else runs beside (the embed phase overlaps reading, tokenizing, storing)
SERIAL_TIMINGS = ("preflight", "lock_wait", "checks", "model_load_wait", "weights_sha256_wait", "index", "clean_up")


def not_overlapped(timings: dict[str, float]) -> dict[str, float]:
    """The serial parts of a run (``SERIAL_TIMINGS`` present in the report's ``timings_s``)."""
    return {k: float(timings[k]) for k in SERIAL_TIMINGS if k in timings}


def format_e2e_summary(results: list[dict[str, Any]]) -> str:
    """One row per corpus size: engine T2, embed phase and whole run side by side, with the serial parts."""
    lines = ["| docs | tokens | engine T2 | embed phase | whole run | index stage | not overlapped |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        t2 = r.get("engine_t2_tokens_per_s")
        embed, whole = r["embed_phase_tokens_per_s"], r["petal_tokens_per_s"]
        timings = r["petal_report"].get("timings_s", {})
        serial = not_overlapped(timings)
        index_s = timings.get("index", 0.0)
        # NOTE: engine T2 not measured (the CPU, --no-engine-t2): "-" (was NaN formatted: "nank")
        lines.append(f"| {r['docs']:,} | {r['tokens'] / 1e6:.1f}M | {f'{t2 / 1e3:,.0f}k' if t2 else '-'} | "
                     f"{embed / 1e3:,.0f}k{_of(embed, t2)} | {whole / 1e3:,.0f}k{_of(whole, t2)} | "
                     f"{index_s:.1f}s ({index_s / r['petal_seconds']:.0%}) | "
                     + ", ".join(f"{k} {v:.1f}s" for k, v in serial.items() if k != "index") + " |")
    return "\n".join(lines)


def _of(value: float, t2: float | None) -> str:
    return f" ({value / t2:.2f})" if t2 else ""


def _scale_label(scale: Any) -> str:
    if scale is None:
        return "in-process"
    return ", ".join(f"{k} {v}" for k, v in (("devices", scale.devices), ("workers", scale.workers)) if v) or "pool"


def format_e2e_table(r: dict[str, Any]) -> str:
    how = r["runs"][0].get("scale", "in-process")
    lines = [f"E2E ({r['device']}, {r['cpu_count']} CPUs, {how}): {r['docs']} docs, {r['tokens']} tokens, "
             "Parquet -> FAISS",
             f"  petal                  {r['petal_tokens_per_s'] / 1e3:>9,.1f}k tok/s "
             f"({r['fraction_of_tokenizer_only']:.0%} of tokenizer-only)",
             f"  tokenizer only         {r['tokenizer_only_tokens_per_s'] / 1e3:>9,.1f}k tok/s"]
    if "engine_t2_tokens_per_s" in r:
        t2 = r["engine_t2_tokens_per_s"]
        lines.append(f"  engine alone (T2)      {t2 / 1e3:>9,.1f}k tok/s")
        for run in r["runs"]:
            embed, whole = run["embed_phase_tokens_per_s"], run["petal_tokens_per_s"]
            lines.append(f"  [{run['scale']}, {run['tokenize_workers']} tokenize workers] embed phase "
                         f"{embed / 1e3:,.1f}k tok/s = {embed / t2:.2f} of engine T2; "
                         f"whole run {whole / 1e3:,.1f}k tok/s = {whole / t2:.2f}")
    if "sentence_transformers_tokens_per_s" in r:
        lines.append(f"  sentence-transformers  {r['sentence_transformers_tokens_per_s'] / 1e3:>9,.1f}k tok/s "
                     f"-> petal {r['ratio_vs_sentence_transformers']:.2f}x")
    for run in r.get("runs", [])[1:]:
        lines.append(f"  petal, {run['tokenize_workers']} tokenize workers "
                     f"{run['petal_tokens_per_s'] / 1e3:>9,.1f}k tok/s "
                     f"({run['fraction_of_tokenizer_only']:.0%} of tokenizer-only at "
                     f"{run['tokenizer_only_tokens_per_s'] / 1e3:,.1f}k)")
    if len(r.get("runs", [])) > 1:
        lines[1] += f" [{r['tokenize_workers']} tokenize workers]"
    timings = r["petal_report"].get("timings_s", {})
    if timings:
        lines.append("  timings: " + ", ".join(f"{k} {v:.2f}s" for k, v in timings.items()))
        steps = r["petal_report"].get("index", {}).get("timings_s", {})
        if "index" in timings:
            share = timings["index"] / r["petal_seconds"]
            lines.append(f"  index stage {timings['index']:.2f}s = {share:.0%} of wall: "
                         + ", ".join(f"{k} {v:.2f}s" for k, v in steps.items()))
        serial = not_overlapped(timings)
        lines.append(f"  not overlapped {sum(serial.values()):.2f}s of {r['petal_seconds']:.2f}s wall: "
                     + ", ".join(f"{k} {v:.2f}s" for k, v in serial.items()))
    stats = r["petal_report"].get("engine", {}).get("stats", {})
    if stats:
        lines.append(f"  engine: {stats.get('graph_captures', 0)} captures, {stats.get('graph_replays', 0)} replays, "
                     f"{stats.get('eager_steps', 0)} eager, {stats.get('padded_tokens', 0)} padded tokens")
    return "\n".join(lines)
