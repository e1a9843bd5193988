"""Index scenario: petal's auto index vs the plain FAISS defaults a user would write, same data.

Synthetic clustered unit vectors (``ClusteredVectors``) are committed to a real embedding store in
shards. petal builds from that store (``build_index``: plan, seeded training, streaming add,
recall tuning) and is searched through ``IndexReader`` with its tuned parameters. The baselines
get the same vectors as one numpy array, as a user holding embeddings would:

* ``IndexFlatIP``: exact search; its results are the ground truth of every row;
* ``IVF4096,Flat`` via ``index_factory``, ``train(all vectors)``, ``add``, ``nprobe = 1`` (the default).

Queries are fresh draws from the same distribution (not in the corpus). Reported per system:
build seconds, recall@10, queries/s (one batched search of all queries), single-query p50,
index size, and for petal (built in a fresh child process) the peak anonymous RSS of the build
(heap; mmapped store pages are page cache) and its peak total RSS (VmHWM, page-cache pages included).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing
import os
import platform
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from petal.bench.vectors import ClusteredVectors, SphereVectors, commit_shard
from petal.pipeline.config import IndexSettings
from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.reliability.errors import EXIT_INTERNAL, PetalError, one_line
from petal.pipeline.store.embeddings import EmbeddingStore, StoreEntry

IVF_BASELINE = "IVF4096,Flat"  # the plain FAISS index a user would write, nprobe left at 1
IVF_BASELINE_LISTS = 4096  # its lists: FAISS trains it on at least as many vectors

SINGLE_QUERIES = 200


class PeakMemory:
    """Samples this process's RssAnon every few ms (``/proc/self/status``); VmHWM for total RSS."""

    def __init__(self) -> None:
        self.start_kib = self._field("RssAnon")
        self.peak_kib = self.start_kib
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _field(name: str) -> int:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
        return 0

    def _run(self) -> None:
        while not self._done.is_set():
            self.peak_kib = max(self.peak_kib, self._field("RssAnon"))
            time.sleep(0.005)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak_kib = max(self.peak_kib, self._field("RssAnon"))

    @property
    def anon_delta_mib(self) -> float:
        return (self.peak_kib - self.start_kib) / 1024


DATA_KINDS = ("clustered", "sphere")
ORDERS = ("shuffled", "by-cluster")


def vector_source(data: str, dim: int, seed: int) -> ClusteredVectors | SphereVectors:
    """The corpus's distribution: ``clustered`` (1024 Gaussian clusters) or ``sphere`` (uniform, no structure)."""
    return SphereVectors(dim, seed) if data == "sphere" else ClusteredVectors(dim, seed, num_clusters=1024)


def _taken(stream: Iterator[np.ndarray], pending: list[np.ndarray], n: int) -> Iterator[np.ndarray]:
    """The next ``n`` rows of ``stream`` (rows drawn past them wait in ``pending`` for the next call)."""
    while n > 0:
        chunk = pending.pop() if pending else next(stream)
        if len(chunk) > n:
            pending.append(chunk[n:])
            chunk = chunk[:n]
        n -= len(chunk)
        yield chunk


def synthetic_store(root: Path, num_vectors: int, dim: int, num_shards: int, seed: int, data: str = "clustered",
                    order: str = "shuffled") -> list[StoreEntry]:
    """``num_vectors`` synthetic vectors as ``num_shards`` committed store entries (ids 0..n-1). ``order``
    ``by-cluster`` draws the clusters one after another, so each shard holds a few topics (data appended by topic:
    an index tuned on its last shard alone misjudges the rest)."""
    store = EmbeddingStore(root / "store")
    store.open()
    source = vector_source(data, dim, seed)
    bounds = np.linspace(0, num_vectors, num_shards + 1).astype(int)
    stream = source.by_cluster(num_vectors) if isinstance(source, ClusteredVectors) and order == "by-cluster" \
        else None
    pending: list[np.ndarray] = []
    return [commit_shard(store, root / "data", f"part-{i:04d}.parquet", list(range(lo, hi)),
                         _taken(stream, pending, hi - lo) if stream is not None else source.chunks(hi - lo))
            for i, (lo, hi) in enumerate(itertools.pairwise(bounds))]


def recall_at_10(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f[:10]) & set(t[:10])) / 10 for f, t in zip(found, truth)]))


def measure_search(index: Any, queries: np.ndarray, k: int = 10) -> tuple[np.ndarray, float, float]:
    """``(ids [q, k], queries/s of one batched call, single-query p50 ms)``."""
    index.search(queries[:8], k)  # warm
    started = time.perf_counter()
    _, ids = index.search(queries, k)
    qps = len(queries) / (time.perf_counter() - started)
    single = []
    for i in range(min(SINGLE_QUERIES, len(queries))):
        t0 = time.perf_counter()
        index.search(queries[i : i + 1], k)
        single.append(1000 * (time.perf_counter() - t0))
    return ids, qps, float(np.median(single))


def _build_child(entry_dirs: list[str], dim: int, settings: dict[str, Any], staging: str, out: Any) -> None:
    """In a fresh process (spawn), so the memory numbers are this build's alone."""
    from petal.pipeline.index.writer import build_index

    try:
        entries = [StoreEntry(Path(d), json.loads((Path(d) / "entry.json").read_text())) for d in entry_dirs]
        index_settings = IndexSettings(**settings)
        load_faiss()
        started = time.perf_counter()
        with PeakMemory() as memory:
            result = build_index(entries, dim, index_settings, Path(staging))
    except Exception as exc:  # NOTE: said to the parent, which waited for an answer that never came
        out.put({"error": one_line(str(exc)) or type(exc).__name__,
                 "exit_code": exc.exit_code if isinstance(exc, PetalError) else EXIT_INTERNAL})
        return
    out.put({"seconds": time.perf_counter() - started, "index": result.record(index_settings).to_dict(),
             "peak_anon_mib": memory.anon_delta_mib, "peak_rss_mib": PeakMemory._field("VmHWM") / 1024})


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _built(child: Any, answers: Any) -> dict[str, Any]:
    """The build child's answer; an error it reported, or its end without one (killed: the OOM killer), raised as a
    ``PetalError``. NOTE: the wait had no end: a child killed while it built left the benchmark waiting for good."""
    import queue

    while True:
        try:
            built: dict[str, Any] = answers.get(timeout=1.0)
            break
        except queue.Empty:
            if child.is_alive():
                continue
            try:  # NOTE: its answer may have come just before it ended
                built = answers.get(timeout=1.0)
                break
            except queue.Empty:
                code = child.exitcode
                how = f"was killed by {_signal_name(-code)}" if code is not None and code < 0 else \
                    f"exited with status {code}"
                error = PetalError(f"the index build (a child process) {how} before it finished"
                                   + (" (out of memory? the OOM killer sends SIGKILL)" if code == -9 else ""))
                raise error from None
    if "error" in built:
        error = PetalError(f"the index build failed: {built['error']}")
        error.exit_code = int(built["exit_code"])
        raise error
    return built


def run_petal(entries: list[StoreEntry], dim: int, settings: IndexSettings, staging: Path, label: str,
              queries: np.ndarray) -> tuple[dict[str, Any], np.ndarray]:
    """Build from the store into ``staging`` in a child process, open it as ``petal query`` does, search."""
    from petal.pipeline.index.search import IndexReader
    from petal.pipeline.manifest import MANIFEST_FILE, IndexRecord, Manifest

    staging.mkdir()
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_build_child, args=([str(e.path) for e in entries], dim, settings.as_dict(),
                                                        str(staging), queue))
    child.start()
    try:
        built = _built(child, queue)
    except BaseException:
        # NOTE: a stop signal (or any error) while the child builds: it is stopped here, before the caller removes its
        # directory; left running, the interpreter waited for it at exit (minutes at 1M vectors), then it failed
        # on the files removed under it with a traceback of its own
        child.kill()  # NOTE: its work is thrown away with its directory (SIGTERM: its own interrupted line)
        child.join()
        raise
    child.join()
    index = IndexRecord.from_dict(built["index"])
    Manifest.bare(index, dim).write(staging / MANIFEST_FILE)
    reader = IndexReader(staging)
    ids, qps, p50 = measure_search(reader.index, queries)
    row = {"system": f"petal ({label})", "factory": index.factory, "storage": index.storage,
           "search": index.search_params, "build_s": round(built["seconds"], 1), "timings_s": index.timings_s,
           "queries_per_s": round(qps, 1), "single_query_ms_p50": round(p50, 3),
           "index_mib": round(sum(p.stat().st_size for p in staging.iterdir()) / (1 << 20), 1),
           "build_peak_anon_mib": round(built["peak_anon_mib"], 1),
           "build_peak_rss_mib": round(built["peak_rss_mib"], 1),
           "tuned_recall_at_10": index.tuning.recall_at_10 if index.tuning is not None else None}
    del reader
    return row, ids


def run_baseline(name: str, factory: str, vectors: np.ndarray, queries: np.ndarray,
                 nprobe: int | None) -> tuple[dict[str, Any], np.ndarray]:
    faiss = load_faiss()
    started = time.perf_counter()
    index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    seconds = time.perf_counter() - started
    if nprobe is not None:
        index.nprobe = nprobe
    ids, qps, p50 = measure_search(index, queries)
    code = faiss.extract_index_ivf(index).code_size + 8 if nprobe is not None else vectors.shape[1] * 4
    row = {"system": name, "factory": factory, "storage": "memory",
           "search": {"nprobe": nprobe} if nprobe is not None else {}, "build_s": round(seconds, 1),
           "queries_per_s": round(qps, 1), "single_query_ms_p50": round(p50, 3),
           "index_mib": round(code * index.ntotal / (1 << 20), 1)}
    return row, ids


def run_index_bench(num_vectors: int, dim: int, num_queries: int = 1000, memories: tuple[str, ...] = ("8G",),
                    target_recall: float = 0.95, num_shards: int = 10, seed: int = 0, baselines: bool = True,
                    factory: str = "auto", workdir: Path | None = None, data: str = "clustered",
                    order: str = "shuffled") -> dict[str, Any]:
    """One scenario: ``num_vectors`` x ``dim`` of ``data`` in ``order``; petal (``factory``) once per
    ``--index-memory`` in ``memories``."""
    # NOTE: only what this run made is removed after it: a --workdir (or its d<dim>) that already held files
    # keeps them; the run writes into a new directory inside it (was: the whole directory removed)
    made_workdir = workdir is not None and not Path(workdir).exists()
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="petal-bench-index-", dir=workdir))
    try:
        return _index_bench(work, num_vectors, dim, num_queries, memories, target_recall, num_shards, seed,
                            baselines, factory, data, order)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if made_workdir:
            with contextlib.suppress(OSError):  # left when something else wrote there meanwhile
                Path(workdir).rmdir()  # type: ignore[arg-type]


def _index_bench(work: Path, num_vectors: int, dim: int, num_queries: int, memories: tuple[str, ...],
                 target_recall: float, num_shards: int, seed: int, baselines: bool, factory: str, data: str,
                 order: str) -> dict[str, Any]:
    from petal.pipeline.config import parse_size

    faiss = load_faiss()
    started = time.perf_counter()
    entries = synthetic_store(work, num_vectors, dim, num_shards, seed, data, order)
    store_s = time.perf_counter() - started
    xq = vector_source(data, dim, seed).reseeded(seed + 1).draw(num_queries)  # not in the corpus
    rows: list[dict[str, Any]] = []
    found: list[np.ndarray] = []
    for memory in memories:
        settings = IndexSettings(factory=factory, memory_bytes=parse_size(memory), target_recall=target_recall)
        row, ids = run_petal(entries, dim, settings, work / f"petal-{memory}", f"{factory}, --index-memory {memory}",
                             xq)
        rows.append(row)
        found.append(ids)
    vectors = np.concatenate([np.asarray(e.embeddings()) for e in entries])  # what a user would hold
    flat, truth = run_baseline("FAISS IndexFlatIP", "Flat", vectors, xq, None)
    rows.insert(0, flat)
    found.insert(0, truth)
    if baselines:
        ivf, ids = run_baseline(f"FAISS {IVF_BASELINE} nprobe=1", IVF_BASELINE, vectors, xq, 1)
        rows.insert(1, ivf)
        found.insert(1, ids)
    del vectors
    for row, ids in zip(rows, found):
        row["recall_at_10"] = round(recall_at_10(ids, truth), 4)
    return {"scenario": "index", "vectors": num_vectors, "dim": dim, "queries": num_queries,
            "data": (f"uniform on the sphere, {num_shards} shards" if data == "sphere" else
                     f"clustered (1024 Gaussian clusters, spread 0.6), {num_shards} shards {order}")
            + ", unit norm, inner product",
            "target_recall_at_10": target_recall, "store_write_s": round(store_s, 1),
            "threads": faiss.omp_get_max_threads(), "cpus": os.cpu_count(), "machine": platform.processor() or
            platform.machine(), "date": time.strftime("%Y-%m-%d"), "results": rows}


def format_index_table(result: dict[str, Any]) -> str:
    lines = [f"index: {result['vectors']:,} x {result['dim']} {result['data']}; {result['queries']} fresh queries, "
             f"{result['threads']} threads, {result['date']}",
             f"{'system':<40}{'index':<22}{'search':<14}{'build s':>9}{'recall@10':>10}{'tuned':>8}{'q/s':>10}"
             f"{'p50 ms':>8}{'MiB':>8}{'peak MiB':>9}"]
    for r in result["results"]:
        search = ",".join(f"{k}={v}" for k, v in r["search"].items()) or "-"
        peak = f"{r['build_peak_anon_mib']:>9.0f}" if "build_peak_anon_mib" in r else f"{'':>9}"
        factory = r["factory"] + (" disk" if r["storage"] == "ondisk" else "")
        tuned = f"{r['tuned_recall_at_10']:>8.4f}" if r.get("tuned_recall_at_10") is not None else f"{'-':>8}"
        lines.append(f"{r['system']:<40}{factory:<22}{search:<14}{r['build_s']:>9.1f}{r['recall_at_10']:>10.4f}{tuned}"
                     f"{r['queries_per_s']:>10,.0f}{r['single_query_ms_p50']:>8.2f}{r['index_mib']:>8.0f}{peak}")
    return "\n".join(lines)
