"""Where the time of ``--search-device cuda`` goes: ``TorchExactIndex.search`` (what a /search batch calls)
against its kernels alone, on random unit vectors (no model, no index files); with ``--ivf NLIST``, then
the same vectors in an IVF index (``TorchIvfIndex``, its lists on the GPU) against FAISS's own IVF search
on the CPU at each ``--nprobe``.

    source .gpu/activate.sh && python3 bench/gpu_search_probe.py [--vectors 1000000] [--dim 1024] [--k 10] \
        [--ivf 4096 --nprobe 8,16,64]

Prints, per query count: the whole call (host to host, median of --repeats, wall clock), and the matmul
and the float16 top-k alone (CUDA events); for the IVF, the whole call on the GPU and FAISS's on the CPU,
and how many of FAISS's ids the GPU copy returned. The issue-13 target is /search p50 <= 3 ms at
concurrency 1.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vectors", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run (no kernel timings)")
    parser.add_argument("--ivf", type=int, default=0, help="lists of an IVF index over the same vectors (0: none)")
    parser.add_argument("--nprobe", default="8,16,64", help="the IVF's nprobe values, comma-separated")
    parser.add_argument("--skip-exact", action="store_true", help="only the IVF")
    parser.add_argument("--index", default=None, help="a published index (OUT): its IVF, exact copy and FAISS")
    args = parser.parse_args()
    if args.index:
        published(args)
        return
    if not args.skip_exact:
        exact(args)
    if args.ivf:
        ivf(args)


def _unit_rows(rng: np.random.Generator, count: int, dim: int) -> np.ndarray:
    rows = rng.standard_normal((count, dim), dtype=np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows


def _median_ms(call, repeats: int) -> tuple[float, float]:
    for _ in range(10):
        call()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    times.sort()
    return 1e3 * statistics.median(times), 1e3 * times[int(0.99 * len(times))]


def published(args: argparse.Namespace) -> None:
    """A published IVF index at its tuned nprobe: the GPU copy of its lists (both plans), the exact copy
    and FAISS on the CPU, for queries near stored vectors."""
    from pathlib import Path

    from petal.pipeline.index.search import IndexReader
    from petal.pipeline.serve import gpu_ivf
    from petal.pipeline.serve.gpu_search import TorchExactIndex

    reader = IndexReader(Path(args.index))
    index: Any = reader.index
    nprobe = int(reader.search_params.get("nprobe", 1))
    sizes = np.array([index.invlists.list_size(i) for i in range(index.nlist)])
    print(f"{args.index}: {reader.manifest.index.factory}, {reader.ntotal:,} vectors, nprobe {nprobe}; list sizes "
          f"mean {sizes.mean():.0f}, p50 {np.median(sizes):.0f}, p99 {np.percentile(sizes, 99):.0f}, max {sizes.max()}")
    lists = gpu_ivf.TorchIvfIndex(index, nprobe, args.device, args.dtype)
    print(lists.describe())
    exact = TorchExactIndex(index, args.device, args.dtype)
    rng = np.random.default_rng(0)
    print(f"{'queries':>8} {'lists ms':>9} {'plan':>7} {'gather ms':>10} {'scan ms':>8} {'exact ms':>9} "
          f"{'faiss ms':>9} {'as faiss':>9} {'recall@k':>9}")
    for nq in (1, 4, 16, 64):
        picks = rng.integers(0, reader.ntotal, nq)
        queries = exact.vectors[picks].float().cpu().numpy() + 0.02 * rng.standard_normal((nq, reader.dim),
                                                                                           dtype=np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        reader._parallel_for(nq)
        row = {}
        saved = gpu_ivf.SCAN_RATIO, gpu_ivf.FUSED_SCAN_RATIO
        for name, ratios in (("auto", saved), ("gather", (1e9, 1e9)), ("scan", (0.0, 0.0))):
            gpu_ivf.SCAN_RATIO, gpu_ivf.FUSED_SCAN_RATIO = ratios
            lists._graphs.clear()
            row[name] = _median_ms(lambda q=queries: lists.search(q, args.k), args.repeats)[0]
        gpu_ivf.SCAN_RATIO, gpu_ivf.FUSED_SCAN_RATIO = saved
        plan = "gather" if lists.gathers(nq, min(nprobe, lists.nlist)) else "scan"
        exact_ms = _median_ms(lambda q=queries: exact.search(q, args.k), args.repeats)[0]
        faiss_ms = _median_ms(lambda q=queries: index.search(q, args.k), max(20, args.repeats // 4))[0]
        got = lists.search(queries, args.k)[1]
        same = np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(got, index.search(queries, args.k)[1])])
        truth = exact.search(queries, args.k)[1]
        recall = np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(got, truth)])
        print(f"{nq:>8} {row['auto']:>9.3f} {plan:>7} {row['gather']:>10.3f} {row['scan']:>8.3f} {exact_ms:>9.3f} "
              f"{faiss_ms:>9.3f} {same:>9.3f} {recall:>9.3f}", flush=True)


def ivf(args: argparse.Namespace) -> None:
    """The IVF copy on the GPU against FAISS's IVF search on the CPU (centroids: a random sample of the
    vectors, so the lists are about equal; random unit vectors have no clusters to find)."""
    import faiss

    from petal.pipeline.serve.gpu_ivf import TorchIvfIndex

    rng = np.random.default_rng(0)
    quantizer = faiss.IndexFlatIP(args.dim)
    quantizer.add(_unit_rows(np.random.default_rng(1), args.ivf, args.dim))
    index = faiss.IndexIVFFlat(quantizer, args.dim, args.ivf, faiss.METRIC_INNER_PRODUCT)
    started = time.perf_counter()
    for start in range(0, args.vectors, 131072):
        index.add(_unit_rows(rng, min(131072, args.vectors - start), args.dim))
    lists = index.invlists
    assert lists is not None
    sizes = np.array([lists.list_size(i) for i in range(args.ivf)])
    print(f"IVF{args.ivf},Flat of {args.vectors:,} x {args.dim} built on the CPU in "
          f"{time.perf_counter() - started:.1f} s; list sizes mean {sizes.mean():.0f}, max {sizes.max()}")
    started = time.perf_counter()
    gpu = TorchIvfIndex(index, 1, args.device, args.dtype)
    print(f"its GPU copy ({args.dtype}, segments of {gpu.segment} rows) in {time.perf_counter() - started:.1f} s")
    print(f"{'nprobe':>6} {'queries':>8} {'gpu ms':>8} {'p99':>7} {'faiss cpu ms':>13} {'p99':>7} {'same ids':>9}")
    for nprobe in (int(n) for n in args.nprobe.split(",")):
        view = gpu.with_nprobe(nprobe)
        index.nprobe = nprobe
        for nq in (1, 4, 16, 64):
            queries = _unit_rows(rng, nq, args.dim)
            index.parallel_mode = 1 if nq == 1 else 0  # what IndexReader.search sets
            gpu_ms, gpu_p99 = _median_ms(lambda v=view, q=queries: v.search(q, args.k), args.repeats)
            cpu_ms, cpu_p99 = _median_ms(lambda q=queries: index.search(q, args.k), max(20, args.repeats // 4))
            same = float((view.search(queries, args.k)[1] == index.search(queries, args.k)[1]).mean())
            print(f"{nprobe:>6} {nq:>8} {gpu_ms:>8.3f} {gpu_p99:>7.3f} {cpu_ms:>13.3f} {cpu_p99:>7.3f} {same:>9.3f}",
                  flush=True)


def exact(args: argparse.Namespace) -> None:

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
