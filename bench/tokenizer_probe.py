"""The tokenizer on this host: batches of 128-token texts through ``encode_batch_fast``, ``encode_batch``, one
text at a time, petal's ``TextTokenizer`` and chunks on 4 / 8 Python threads; first with the interpreter idle,
then with a Python thread spinning (a busy event loop holding the GIL, at the default 5 ms switch interval).

From the project root: ``python3 bench/tokenizer_probe.py [TOKENIZER_JSON]`` (default: the GPU kit's MiniLM
tokenizer). README "Serving", eleventh round.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers
from tokenizers import Tokenizer

from petal.bench.corpus import load_sentences, make_texts
from petal.pipeline.ingest.tokens import TextTokenizer

BATCH_SIZES = (1, 8, 25, 64, 256)


def variants(path: Path) -> tuple[list[str], dict[str, Callable[[list[str]], Any]]]:
    petal_tokenizer = TextTokenizer(path, 512)
    texts = make_texts(load_sentences(Path("sample_data")), petal_tokenizer, np.full(4000, 128), seed=0)
    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(512)
    pool = ThreadPoolExecutor(8)

    def chunked(batch: list[str], parts: int) -> list[Any]:
        size = -(-len(batch) // parts)
        futures = [pool.submit(tok.encode_batch_fast, batch[i:i + size]) for i in range(0, len(batch), size)]
        return [e for f in futures for e in f.result()]

    return texts, {
        "batch_fast": tok.encode_batch_fast,
        "batch": tok.encode_batch,
        "one by one": lambda batch: [tok.encode(t) for t in batch],
        "petal": petal_tokenizer.encode,
        "4 threads": lambda batch: chunked(batch, 4),
        "8 threads": lambda batch: chunked(batch, 8),
    }


def table(label: str, texts: list[str], calls: dict[str, Callable[[list[str]], Any]]) -> None:
    print(f"--- {label}: us a text (process CPU / wall)")
    for n in BATCH_SIZES:
        row = []
        for name, call in calls.items():
            call(texts[:n])  # warm
            reps = max(5, 200 // n)
            wall0, cpu0 = time.perf_counter(), time.process_time()
            for r in range(reps):
                start = (r * n) % 3000
                call(texts[start:start + n])
            wall = (time.perf_counter() - wall0) / reps
            cpu = (time.process_time() - cpu0) / reps
            row.append(f"{name} {wall * 1e6 / n:6.1f} (x{cpu / wall:4.1f})")
        print(f"n={n:4d} " + " | ".join(row))


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".gpu/minilm-tokenizer/tokenizer.json")
    print("tokenizers", tokenizers.__version__, "TOKENIZERS_PARALLELISM", os.environ.get("TOKENIZERS_PARALLELISM"),
          "cores", len(os.sched_getaffinity(0)), "RAYON_NUM_THREADS", os.environ.get("RAYON_NUM_THREADS"))
    texts, calls = variants(path)
    table("idle interpreter", texts, calls)
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    table("a Python thread spinning", texts, calls)
    stop.set()
    spinner.join()


if __name__ == "__main__":
    main()
