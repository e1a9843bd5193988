"""CPU scenario: the packaged MiniLM with real weights vs sentence-transformers ``encode()``.

Both embed the same texts from raw strings (tokenization included), interleaved over several
rounds; the median round of each is reported, with the ratio and the cosine to the baseline.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from petal.bench.corpus import load_sentences, lognormal_lengths, make_texts
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine, resolve_dtype
from petal.engine.loader import inspect_model
from petal.pipeline.ingest.tokens import TextTokenizer
from petal.pipeline.jobs.embed import encode_texts


def run_cpu_bench(corpus: Path, num_texts: int = 2000, rounds: int = 3,
                  dtypes: tuple[str, ...] = ("float32", "bfloat16"), token_budget: int = 4096,
                  model: str | None = None) -> dict[str, Any]:
    import torch
    from sentence_transformers import SentenceTransformer

    spec = inspect_model(model)
    tokenizer = TextTokenizer(spec.tokenizer_file, spec.pooling.max_length)
    lengths = lognormal_lengths(num_texts, 150, 0.8, 8, spec.pooling.max_length)
    texts = make_texts(load_sentences(corpus), tokenizer, lengths)
    num_tokens = sum(len(ids) for ids in tokenizer.encode(texts).token_ids)

    baseline = SentenceTransformer(str(spec.path), device="cpu")
    engines = {d: Engine(spec, EngineConfig(device="cpu", dtype=resolve_dtype(d, "cpu"), token_budget=token_budget))
               for d in dtypes}
    warm = texts[:64]
    baseline.encode(warm, batch_size=32)
    for engine in engines.values():
        encode_texts(engine, tokenizer, warm)

    times: dict[str, list[float]] = {"sentence-transformers": [], **{f"petal {d}": [] for d in dtypes}}
    outputs: dict[str, np.ndarray] = {}
    for _ in range(rounds):
        started = time.perf_counter()
        outputs["sentence-transformers"] = baseline.encode(texts, batch_size=32, convert_to_numpy=True)
        times["sentence-transformers"].append(time.perf_counter() - started)
        for d, engine in engines.items():
            started = time.perf_counter()
            outputs[f"petal {d}"], _ = encode_texts(engine, tokenizer, texts)
            times[f"petal {d}"].append(time.perf_counter() - started)

    ref = outputs["sentence-transformers"]
    ref_n = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    base_s = statistics.median(times["sentence-transformers"])
    rows = []
    for name, ts in times.items():
        seconds = statistics.median(ts)
        out = outputs[name] / np.linalg.norm(outputs[name], axis=1, keepdims=True)
        cos = (out * ref_n).sum(axis=1)
        rows.append({"system": name, "seconds": round(seconds, 3), "tokens_per_s": round(num_tokens / seconds, 1),
                     "texts_per_s": round(num_texts / seconds, 1),
                     "ratio_to_sentence_transformers": round(base_s / seconds, 3),
                     "min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()),
                     "rounds_s": [round(t, 3) for t in ts]})
    return {"scenario": "cpu", "model": str(spec.path), "texts": num_texts, "tokens": num_tokens,
            "mean_tokens": round(num_tokens / num_texts, 1), "torch_threads": torch.get_num_threads(),
            "token_budget": token_budget, "rounds": rounds, "results": rows}


def format_cpu_table(result: dict[str, Any]) -> str:
    lines = [f"CPU: {result['texts']} texts, {result['tokens']} tokens (mean {result['mean_tokens']}), "
             f"{result['torch_threads']} threads, median of {result['rounds']} rounds",
             f"{'system':<24}{'tok/s':>10}{'texts/s':>10}{'ratio':>8}{'min cos':>10}"]
    for r in result["results"]:
        lines.append(f"{r['system']:<24}{r['tokens_per_s']:>10,.0f}{r['texts_per_s']:>10,.1f}"
                     f"{r['ratio_to_sentence_transformers']:>7.2f}x{r['min_cosine']:>10.6f}")
    return "\n".join(lines)
