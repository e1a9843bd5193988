"""Where the time of ``--search-device cuda`` goes: ``TorchExactIndex.search`` (what a /search batch calls)
against its kernels alone, on random unit vectors (no model, no index files).

    source .gpu/activate.sh && python3 bench/gpu_search_probe.py [--vectors 1000000] [--dim 1024] [--k 10]

Prints, per query count: the whole call (host to host, median of --repeats, wall clock), and the matmul
and the float16 top-k alone (CUDA events). The issue-13 target is /search p50 <= 3 ms at concurrency 1.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vectors", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run (no kernel timings)")
    args = parser.parse_args()

    import faiss
    import torch

    from petal.pipeline.serve.gpu_search import RESCORE_FACTOR, TorchExactIndex

    rng = np.random.default_rng(0)
    flat = faiss.IndexFlatIP(args.dim)
    for start in range(0, args.vectors, 131072):  # 512 MiB of float32 at a time
        rows = rng.standard_normal((min(131072, args.vectors - start), args.dim), dtype=np.float32)
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        flat.add(rows)
    started = time.perf_counter()
    index = TorchExactIndex(flat, args.device, args.dtype)
    print(f"copy of {args.vectors:,} x {args.dim} ({args.dtype}) on the GPU in {time.perf_counter() - started:.1f} s")
    del flat
    print(f"{'queries':>8} {'search ms':>10} {'p99 ms':>8} {'matmul ms':>10} {'topk ms':>8} {'2-stage topk ms':>16} "
          f"{'rescore ms':>11}")
    for nq in (1, 4, 16, 64):
        queries = rng.standard_normal((nq, args.dim), dtype=np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        for _ in range(10):
            index.search(queries, args.k)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            index.search(queries, args.k)
            times.append(time.perf_counter() - t0)
        times.sort()
        whole = f"{nq:>8} {1e3 * statistics.median(times):>10.3f} {1e3 * times[int(0.99 * len(times))]:>8.3f}"
        if args.device != "cuda":
            print(whole, flush=True)
            continue
        q = torch.from_numpy(queries).cuda().to(index.dtype)
        candidates = max(args.k * RESCORE_FACTOR, args.k + 32)
        mm_ms, topk_ms, two_ms, rescore_ms = [], [], [], []
        chunks = 1024
        width = -(-index.ntotal // chunks)
        padded = torch.full((nq, chunks * width), float("-inf"), device=q.device, dtype=index.dtype)
        for _ in range(50):
            a, b, c, d, e = (torch.cuda.Event(enable_timing=True) for _ in range(5))
            a.record()
            scores = torch.mm(q, index.vectors.T)
            b.record()
            _, idx = torch.topk(scores, candidates, dim=1, sorted=False)
            c.record()
            # two stages: the top `candidates` of each of 1024 chunks, then of their union
            padded[:, : index.ntotal] = scores
            part, _ = torch.topk(padded.view(nq, chunks, width), min(candidates, width), dim=2, sorted=False)
            torch.topk(part.reshape(nq, -1), candidates, dim=1, sorted=False)
            d.record()
            cand_rows = index.vectors[idx].float()
            fine = torch.bmm(cand_rows, q.float().unsqueeze(2)).squeeze(2)
            torch.topk(fine, args.k, dim=1)
            e.record()
            e.synchronize()
            mm_ms.append(a.elapsed_time(b))
            topk_ms.append(b.elapsed_time(c))
            two_ms.append(c.elapsed_time(d))
            rescore_ms.append(d.elapsed_time(e))
        print(f"{whole} {statistics.median(mm_ms):>10.3f} {statistics.median(topk_ms):>8.3f} "
              f"{statistics.median(two_ms):>16.3f} {statistics.median(rescore_ms):>11.3f}", flush=True)


if __name__ == "__main__":
    main()
