"""What a lone query pays around the engine step, on the CPU: tokenization of one text, and the hand-off
of a ``/search`` by text between the engine thread and the search thread.

    python bench/lone_request_probe.py [tokenize] [handoff]      (default: both)

- ``tokenize``: ``TextTokenizer.encode([text])`` of one plain-ASCII text (20 and ~130 tokens, the packaged
  MiniLM tokenizer), with the Python ASCII normaliser (pipeline/ingest/ascii_normalize.py) and with the
  tokenizer's own Rust normaliser, taking turns, best of two blocks of 3000 calls.
- ``handoff``: lone searches through the real ``TokenBatcher`` and ``SearchBatcher`` (a random 2-layer
  BERT with MiniLM's tokenizer, so the step is short, and an index of ``sample_data`` built by
  ``petal index``): embed, then search from the event loop ("loop") against the search queued from the
  engine thread (``SearchTicket``, what ``petal serve`` does: "engine"), interleaved, 2000 each.
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SAMPLE_DATA = Path(__file__).resolve().parent.parent / "sample_data"


def section_tokenize() -> None:
    from petal.engine.loader import default_model_dir, inspect_model
    from petal.pipeline.ingest.tokens import TextTokenizer

    spec = inspect_model(default_model_dir())
    tokenizer = TextTokenizer(spec.tokenizer_file, 512)
    words = spec.tokenizer_file.with_name("vocab.txt").read_text().split()[2000:12000]
    rng = random.Random(0)
    for count in (12, 110):
        text = " ".join(rng.choice(words) for _ in range(count)).capitalize() + "."
        best: dict[str, float] = {}
        for label in ("python", "rust", "python", "rust"):
            fast = tokenizer._ascii
            if label == "rust":
                tokenizer._ascii = None
            for _ in range(200):
                tokenizer.encode([text])
            started = time.perf_counter()
            for _ in range(3000):
                tokenizer.encode([text])
            us = (time.perf_counter() - started) / 3000 * 1e6
            best[label] = min(best.get(label, us), us)
            tokenizer._ascii = fast
        tokens = len(tokenizer.encode([text]).token_ids[0])
        print(f"  tokenize {tokens:4d} tokens: ASCII normaliser in Python {best['python']:.1f} us | "
              f"Rust normaliser {best['rust']:.1f} us ({best['python'] / best['rust']:.2f}x)")


def tiny_model_dir(out: Path) -> Path:
    import torch

    from petal.bench.shapes import Shape, hf_model, save_model_dir
    from petal.engine.loader import default_model_dir

    tiny = Shape("tiny-bert", {
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30522, "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 160,
        "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu", "pad_token_id": 0}, "mean", True, 128)
    return save_model_dir(tiny, hf_model(tiny, torch.device("cpu"), torch.float32), default_model_dir(), out)


def section_handoff(calls: int = 2000) -> None:
    from click.testing import CliRunner

    from petal.cli.main import cli
    from petal.engine.loader import inspect_model
    from petal.pipeline.jobs.query import QueryModel, SearchIndex, engine_config
    from petal.pipeline.serve.batcher import TokenBatcher
    from petal.pipeline.serve.metrics import ServeMetrics
    from petal.pipeline.serve.search_batcher import SearchBatcher
    from petal.pipeline.serve.searching import SharedExclusiveLock

    work = Path(tempfile.mkdtemp(prefix="petal-handoff-"))
    model_dir = tiny_model_dir(work / "model")
    out = work / "out"
    result = CliRunner().invoke(cli, ["index", str(SAMPLE_DATA), "--out", str(out), "-q", "--model", str(model_dir)])
    assert result.exit_code == 0, result.output
    spec = inspect_model(model_dir)
    index = SearchIndex.open(out, spec)
    model = QueryModel(spec, engine_config(spec, "cpu"))
    tokens = TokenBatcher(model.engine, ServeMetrics(), tokenizers=dict(model.tokenizers))
    searcher = SearchBatcher(SharedExclusiveLock())
    query = "how do glaciers move"

    async def from_loop() -> object:
        rows = (await tokens.embed_texts([query], "query", False, "query")).rows
        return await searcher.search(index, rows, True, 10)

    async def from_engine() -> object:
        ticket = searcher.reserve(index, 1, 10)
        try:
            await tokens.embed_texts([query], "query", False, "query", then=ticket.submit)
        finally:
            ticket.cancel()
        return await ticket.future

    async def run() -> dict[str, list[float]]:
        tokens.start()
        searcher.start()
        times: dict[str, list[float]] = {"loop": [], "engine": []}
        variants = (("loop", from_loop), ("engine", from_engine))
        for i in range(calls + 50):
            for label, fn in variants if i % 2 else variants[::-1]:
                started = time.perf_counter()
                await fn()
                if i >= 50:
                    times[label].append(time.perf_counter() - started)
        return times

    try:
        times = asyncio.run(run())
    finally:
        tokens.close()
        searcher.close()
    for label, values in times.items():
        ms = np.array(values) * 1e3
        print(f"  handoff search queued from the {label:<6}: p50 {np.median(ms):.3f} ms, mean {ms.mean():.3f} ms "
              f"({len(ms)} lone searches)")


def main() -> None:
    sections = sys.argv[1:] or ["tokenize", "handoff"]
    for name in sections:
        {"tokenize": section_tokenize, "handoff": section_handoff}[name]()


if __name__ == "__main__":
    main()
