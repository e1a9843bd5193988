"""How many nodes of a FAISS HNSW graph no walk reaches, and what linking them (``graph_repair.link_unreachable``,
which ``petal index`` runs on every HNSW it builds) changes. CPU, seconds.

    python3 bench/graph_repair_probe.py [NUM_VECTORS] [DIM] [M ...]        (default: 20000 32 8 16 32)

Gaussian vectors (standard normal, not normalized: no structure), seed 0, l2. Per M, the same graph before and
after the repair: nodes a level-0 walk from the entry point does not reach, the links made, the seconds it took,
how many of the first 5,000 vectors a search for their own vector at efSearch 512 does not return first, and
recall@10 of 500 fresh queries at efSearch 16/32/64 against exact search.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.graph_repair import Level0, link_unreachable

SELF_QUERIES = 5000
FRESH_QUERIES = 500


def main(num_vectors: int, dim: int, ms: list[int]) -> None:
    faiss = load_faiss()
    vectors = np.random.default_rng(0).standard_normal((num_vectors, dim), dtype=np.float32)
    fresh = np.random.default_rng(1).standard_normal((FRESH_QUERIES, dim), dtype=np.float32)
    exact = faiss.IndexFlatL2(dim)
    exact.add(vectors)
    _, truth = exact.search(fresh, 10)
    own = vectors[:SELF_QUERIES]
    print(f"{num_vectors:,} x {dim} Gaussian, l2; own-vector searches of {len(own):,} at efSearch 512")
    print(f"{'M':>3} {'graph':<9}{'unreached':>10}{'links':>7}{'s':>6}{'own lost':>9}  recall@10 ef 16/32/64")
    for m in ms:
        index = faiss.IndexHNSWFlat(dim, m)
        index.add(vectors)
        for label in ("as built", "repaired"):
            made, seconds = 0, 0.0
            if label == "repaired":
                started = time.perf_counter()
                made = link_unreachable(index)
                seconds = time.perf_counter() - started
            unreached = int((~Level0(index.hnsw).reached()).sum())
            index.hnsw.efSearch = 512
            _, found = index.search(own, 1)
            lost = int((found[:, 0] != np.arange(len(own))).sum())
            recalls = []
            for ef in (16, 32, 64):
                index.hnsw.efSearch = ef
                _, ids = index.search(fresh, 10)
                recalls.append(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, truth)]))
            print(f"{m:>3} {label:<9}{unreached:>10}{made:>7}{seconds:>6.2f}{lost:>9}  "
                  + " / ".join(f"{r:.4f}" for r in recalls))


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    main(args[0] if args else 20000, args[1] if len(args) > 1 else 32, args[2:] or [8, 16, 32])
