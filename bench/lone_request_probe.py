"""What a lone query pays around the engine step, on the CPU: tokenization of one text, and the hand-off
of a ``/search`` by text between the engine thread and the search thread.

    python bench/lone_request_probe.py [tokenize] [handoff] [coarse]      (default: tokenize handoff)

- ``tokenize``: ``TextTokenizer.encode([text])`` of one plain-ASCII text (20 and ~130 tokens, the packaged
  MiniLM tokenizer) on its three paths, taking turns, best of two blocks of 3000 calls: the WordPiece
  encoding in Python with its word cache (pipeline/ingest/lone_wordpiece.py, the default), the Python
  ASCII normaliser before the Rust encoder without its own (pipeline/ingest/ascii_normalize.py), and the
  tokenizer's own Rust encoding; the WordPiece path with no word cached (every word split in Python);
  the first text of a fresh tokenizer; and the slowest text tried for the split (six 90-letter words of
  common two-letter pieces).
- ``handoff``: lone searches through the real ``TokenBatcher`` and ``SearchBatcher`` (a random 2-layer
  BERT with MiniLM's tokenizer, so the step is short, and an index of ``sample_data`` built by
  ``petal index``): embed, then search from the event loop ("loop") against the search queued from the
  engine thread (``SearchTicket``, what ``petal serve`` does: "engine"), interleaved, 2000 each.
- ``coarse``: one query at a time against an IVF index over a flat quantizer (random unit vectors,
  ``PETAL_COARSE_SHAPE=N,D,NLIST,NPROBE``, default 200000,1024,1024,32; the H200 host: 1000000,1024,4096,16):
  FAISS's own search with ``parallel_mode`` 0 and 1 (``IndexReader.search`` uses 1 for a lone query),
  and ``CoarseLists`` (the lists from one numpy BLAS product; tried and dropped) with each mode, taking
  turns; the hits of every variant checked equal; then the quantizer alone both ways.
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from petal.pipeline.index.faiss_loader import load_faiss

SAMPLE_DATA = Path(__file__).resolve().parent.parent / "sample_data"


def section_tokenize() -> None:
    from petal.engine.loader import default_model_dir, inspect_model
    from petal.pipeline.ingest.ascii_normalize import AsciiBertNormalizer
    from petal.pipeline.ingest.tokens import TextTokenizer

    spec = inspect_model(default_model_dir())
    tokenizer = TextTokenizer(spec.tokenizer_file, 512)
    wordpiece = tokenizer._wordpiece
    ascii_normalizer = AsciiBertNormalizer.for_tokenizer(tokenizer._tokenizer)
    paths = {"wordpiece": (wordpiece, None), "bare": (None, ascii_normalizer), "rust": (None, None)}
    words = spec.tokenizer_file.with_name("vocab.txt").read_text().split()[2000:12000]
    rng = random.Random(0)
    for count in (12, 110):
        text = " ".join(rng.choice(words) for _ in range(count)).capitalize() + "."
        started = time.perf_counter()
        cold = TextTokenizer(spec.tokenizer_file, 512)
        made = time.perf_counter()
        cold.encode([text])
        first = (time.perf_counter() - made) * 1e6
        best: dict[str, float] = {}
        for label in [*paths, *paths]:
            tokenizer._wordpiece, tokenizer._ascii = paths[label]
            for _ in range(200):
                tokenizer.encode([text])
            started = time.perf_counter()
            for _ in range(3000):
                tokenizer.encode([text])
            us = (time.perf_counter() - started) / 3000 * 1e6
            best[label] = min(best.get(label, us), us)
        tokenizer._wordpiece, tokenizer._ascii = paths["wordpiece"]
        assert wordpiece is not None
        for _ in range(2):  # every word new to the cache: each split by WordPiece in Python
            started = time.perf_counter()
            for _ in range(1000):
                wordpiece._cache.clear()
                tokenizer.encode([text])
            us = (time.perf_counter() - started) / 1000 * 1e6
            best["uncached"] = min(best.get("uncached", us), us)
        tokens = len(tokenizer.encode([text]).token_ids[0])
        if count == 110:  # the slowest text tried: long words of common two-letter pieces, no word cached
            from petal.pipeline.ingest.lone_wordpiece import _WORDS

            slow = " ".join("".join(rng.choice(["in", "re", "co", "st"]) for _ in range(45)) for _ in range(6))
            assert wordpiece._split is not None
            lookups = sum(wordpiece._split(word, 1 << 30)[1] for word in _WORDS.findall(slow))
            times = []
            for _ in range(20):
                wordpiece._cache.clear()
                started = time.perf_counter()
                taken = wordpiece(slow) is not None
                times.append(time.perf_counter() - started)
            print(f"  tokenize six 90-letter words of two-letter pieces ({len(slow)} characters), no word cached: "
                  f"{lookups} lookups, {min(times) * 1e6:.0f} us, {'split in Python' if taken else 'declined'}")
        print(f"  tokenize {tokens:4d} tokens: WordPiece in Python, cached words {best['wordpiece']:.1f} us, "
              f"no word cached {best['uncached']:.1f} us (a fresh tokenizer's first text: {first:.1f} us) | "
              f"ASCII normaliser in Python + Rust encode "
              f"{best['bare']:.1f} us | Rust {best['rust']:.1f} us "
              f"({best['wordpiece'] / best['rust']:.2f}x, {best['bare'] / best['rust']:.2f}x)")


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


class CoarseLists:
    """Tried and dropped (README "Serving"): the nearest inverted lists of a lone query from an IVF index's
    flat quantizer by one numpy BLAS product, then FAISS's ``search_preassigned``.

    FAISS's flat quantizer scores a lone query against the centroids on one thread (H200 host, 4096 x 1024:
    0.66-0.77 ms; this product 0.07-0.11 ms), but numpy's BLAS threads and FAISS's OpenMP threads then take
    turns spinning on the same cores: with ``parallel_mode`` 1 a lone search took 20-30 ms.
    """

    def __init__(self, index: Any, quantizer: Any, inner_product: bool) -> None:
        self._index = index
        self._quantizer = quantizer
        self._inner_product = inner_product
        self._lock = threading.Lock()
        self._centroids: np.ndarray | None = None  # [nlist, d] float32
        self._half_norms: np.ndarray | None = None  # [nlist] |c|^2 / 2 (L2)

    @classmethod
    def of(cls, index: Any) -> CoarseLists | None:
        """For an IVF index (not wrapped) over a flat quantizer, else ``None`` (FAISS searches as it is)."""
        faiss = load_faiss()
        if not isinstance(index, faiss.IndexIVF):
            return None
        quantizer = faiss.downcast_index(index.quantizer)
        if not isinstance(quantizer, faiss.IndexFlat) or quantizer.metric_type != index.metric_type:
            return None
        if index.metric_type not in (faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2):
            return None
        return cls(index, quantizer, index.metric_type == faiss.METRIC_INNER_PRODUCT)

    def search(self, queries: np.ndarray, k: int, params: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """The index's ``search(queries [n, d], k, params)``, its lists found here (``params``: FAISS
        ``SearchParametersIVF`` or ``None``; its ``nprobe``, else the index's)."""
        faiss = load_faiss()
        nprobe = int(params.nprobe) if params is not None else int(self._index.nprobe)
        lists, list_scores = self.nearest(queries, nprobe)
        n = len(queries)
        scores = np.empty((n, k), dtype=np.float32)
        ids = np.empty((n, k), dtype=np.int64)
        # NOTE: the C++ call itself: FAISS's Python wrapper of search_preassigned refuses search parameters
        # (a --where selector rides in them). Every array is contiguous and outlives the call.
        self._index.search_preassigned_c(n, faiss.swig_ptr(queries), k, faiss.swig_ptr(lists),
                                         faiss.swig_ptr(list_scores), faiss.swig_ptr(scores), faiss.swig_ptr(ids),
                                         False, params)
        return scores, ids

    def nearest(self, queries: np.ndarray, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
        """``(lists [n, nprobe] int64, their scores [n, nprobe] float32)``, nearest first, as FAISS's quantizer
        gives them (inner product, or squared L2 distance)."""
        centroids, half_norms = self._load()
        nprobe = max(1, min(nprobe, len(centroids)))
        scores = queries @ centroids.T  # [n, nlist]
        if not self._inner_product:  # rank by |c|^2 / 2 - q.c, the part of |q - c|^2 that depends on c
            assert half_norms is not None
            scores = half_norms[None, :] - scores
            scores = -scores
        if nprobe < scores.shape[1]:
            top = np.argpartition(-scores, nprobe - 1, axis=1)[:, :nprobe]
        else:
            top = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
        top_scores = np.take_along_axis(scores, top, axis=1)
        order = np.argsort(-top_scores, axis=1, kind="stable")
        lists = np.ascontiguousarray(np.take_along_axis(top, order, axis=1), dtype=np.int64)
        found = np.take_along_axis(top_scores, order, axis=1)
        if not self._inner_product:  # back to squared distances
            found = (queries * queries).sum(axis=1, keepdims=True) - 2.0 * found
        return lists, np.ascontiguousarray(found, dtype=np.float32)

    def _load(self) -> tuple[np.ndarray, np.ndarray | None]:
        with self._lock:
            if self._centroids is None:
                centroids = np.ascontiguousarray(self._quantizer.reconstruct_n(0, self._quantizer.ntotal),
                                                 dtype=np.float32)
                if not self._inner_product:
                    self._half_norms = 0.5 * (centroids * centroids).sum(axis=1)
                self._centroids = centroids
            return self._centroids, self._half_norms


def section_coarse(calls: int = 300) -> None:
    import os

    faiss = load_faiss()
    fields = os.environ.get("PETAL_COARSE_SHAPE", "200000,1024,1024,32").split(",")
    n, d, nlist = (int(v) for v in fields[:3])
    nprobes = [int(v) for v in fields[3].split("/")]  # several: 16/64
    rng = np.random.default_rng(0)
    base = rng.standard_normal((n, d), dtype=np.float32)
    faiss.normalize_L2(base)
    index = faiss.index_factory(d, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
    index.train(base[: min(n, 40 * nlist)])
    index.add(base)
    coarse = CoarseLists.of(index)
    assert coarse is not None
    queries = base[rng.choice(n, calls)] + 0.05 * rng.standard_normal((calls, d), dtype=np.float32)

    def faiss_search(q: np.ndarray) -> np.ndarray:
        return index.search(q, 10)[1]

    def coarse_search(q: np.ndarray) -> np.ndarray:
        return coarse.search(q, 10)[1]

    for nprobe in nprobes:
        index.nprobe = nprobe
        variants = {"faiss, parallel_mode 0": (0, faiss_search), "faiss, parallel_mode 1": (1, faiss_search),
                    "CoarseLists, parallel_mode 0": (0, coarse_search),
                    "CoarseLists, parallel_mode 1": (1, coarse_search)}
        best: dict[str, float] = {}
        found: dict[str, list[list[int]]] = {}
        for _ in range(2):
            for label, (mode, fn) in variants.items():
                index.parallel_mode = mode
                started = time.perf_counter()
                hits = [fn(q[None, :])[0].tolist() for q in queries]
                best[label] = min(best.get(label, 1e9), (time.perf_counter() - started) / calls * 1e3)
                found[label] = hits
        same = len({str(hits) for hits in found.values()}) == 1
        print(f"lone searches, {n} x {d} in IVF{nlist},Flat, nprobe {nprobe}, {faiss.omp_get_max_threads()} threads "
              f"(best of 2 x {calls}; hits of every variant equal: {same})")
        for label, ms in best.items():
            print(f"  {label:<30} {ms:.3f} ms")
        quantizer = faiss.downcast_index(index.quantizer)
        for label, search in (("quantizer: FAISS's flat search", quantizer.search),
                              ("quantizer: CoarseLists.nearest", coarse.nearest)):
            started = time.perf_counter()
            for q in queries:
                search(q[None, :], nprobe)
            print(f"  {label:<30} {(time.perf_counter() - started) / calls * 1e3:.3f} ms")


def main() -> None:
    sections = sys.argv[1:] or ["tokenize", "handoff"]
    for name in sections:
        {"tokenize": section_tokenize, "handoff": section_handoff, "coarse": section_coarse}[name]()


if __name__ == "__main__":
    main()
