"""Binary indexes: sign bits in a FAISS ``IndexBinaryFlat``/``IndexBinaryIVF`` (Hamming), with
``rescore.npy`` beside them (the stored float vectors as float16, FAISS id order, memory-mapped).

A search takes ``rescore * k`` Hamming candidates per query and, when ``rescore > 0``, re-ranks
them by the float similarity of the query to their ``rescore.npy`` rows (read from disk). The
tuner (``pipeline/index/tune.py``) measures this whole search against exact float search.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.files import INDEX_FILE
from petal.pipeline.index.open_checks import RESCORE_FILE as RESCORE_FILE  # re-exported: writer.py, search.py
from petal.pipeline.index.open_checks import rescore_path, rescore_vectors
from petal.pipeline.index.widen import EF_FLOOR, searched_again
from petal.pipeline.manifest import Manifest
from petal.pipeline.reliability.errors import BadInputError, quote_path

DEFAULT_RESCORE = 10  # Hamming candidates per wanted hit, re-ranked with float vectors
# NOTE: what bounds a search's memory when k x rescore reaches the whole index (petal serve takes rescore up to
# 65536 from any request): Hamming candidates a FAISS call returns (12 bytes each, over its queries), and rescore
# rows read and scored at a time (float32, dim wide)
CANDIDATES_PER_CALL = 1 << 22
RESCORE_ROWS = 1 << 16
# NOTE: a hash index (BHash...) looks up every bucket within nflip bit flips of the query's b-bit hash, sum of
# C(b, i) for i <= nflip of them a query: nflip is kept where that is at most this many (b 64: nflip 3)
MAX_FLIP_BUCKETS = 1 << 20


def flip_buckets(bits: int, nflip: int) -> int:
    """Buckets a hash index of ``bits``-bit hashes looks up for one query (and hash table) at ``nflip``."""
    return sum(math.comb(bits, i) for i in range(nflip + 1))


class BinaryIndex:
    """A published binary index: float queries -> sign bits -> Hamming candidates -> float rescoring.

    ``search`` returns scores (larger is better for ``ip``: the rescored similarity, or
    ``1 - 2 hamming / dim`` without rescoring; for ``l2``: squared distance or Hamming distance).
    """

    def __init__(self, index: Any, rescore_vectors: np.ndarray | None, metric: str, rescore: int,
                 source: Path | None = None) -> None:
        self.index = index
        self.rescore_vectors = rescore_vectors
        self.metric = metric
        self.rescore = rescore if rescore_vectors is not None else 0
        self.d = int(index.d)
        self.source = source  # the index.faiss it was read from: named when its body turns out damaged

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    @property
    def nlist(self) -> int:
        """Inverted lists (0: exhaustive Hamming search)."""
        return int(getattr(self.index, "nlist", 0))

    @property
    def is_graph(self) -> bool:
        """True for a binary HNSW (``BHNSW...``): its search walks a graph over the codes, as wide as ``efSearch``."""
        return isinstance(self.index, load_faiss().IndexBinaryHNSW)

    @property
    def hash_bits(self) -> int:
        """The bits of a hash index's (``BHash...``) bucket keys (0: not a hash index)."""
        faiss = load_faiss()
        return int(self.index.b) if isinstance(self.index, (faiss.IndexBinaryHash, faiss.IndexBinaryMultiHash)) else 0

    @property
    def max_nflip(self) -> int:
        """The largest nflip a hash index searches with (``MAX_FLIP_BUCKETS``)."""
        bits, nflip = self.hash_bits, 0
        while nflip < bits and flip_buckets(bits, nflip + 1) <= MAX_FLIP_BUCKETS:
            nflip += 1
        return nflip

    def set_params(self, params: dict[str, int]) -> None:
        """Search parameters by name (binary indexes are outside FAISS's ``ParameterSpace``): an IVF's nprobe, an HNSW's
        efSearch (at most ``EF_FLOOR`` or the vectors held, whichever is more), a hash index's nflip (0 where not
        given; at most ``max_nflip``)."""
        if "nprobe" in params and self.nlist:
            self.index.nprobe = int(params["nprobe"])
        if "efSearch" in params and self.is_graph:
            # NOTE: FAISS sizes each search's heaps by efSearch: a manifest signed again with 2^31-1 must not
            self.index.hnsw.efSearch = min(int(params["efSearch"]), max(EF_FLOOR, self.ntotal))
        if self.hash_bits:
            self.index.nflip = min(int(params.get("nflip", 0)), self.max_nflip)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``queries [n, dim]`` float32 (stored space) -> ``(scores [n, k], ids [n, k])``; ids -1 pad.

        Memory is bounded whatever ``k * rescore`` asks for (up to the whole index): FAISS returns at most
        ``CANDIDATES_PER_CALL`` candidates a call (one query's at least), and a query's candidates are read and
        scored ``RESCORE_ROWS`` rows at a time."""
        if not len(queries):  # NOTE: no parts to concatenate (np.concatenate([]) raised ValueError)
            return np.empty((0, k), dtype=np.float32), np.full((0, k), -1, dtype=np.int64)
        codes = np.packbits(queries >= 0, axis=1)
        wanted = min(self.ntotal, k * max(self.rescore, 1))
        per_call = max(1, CANDIDATES_PER_CALL // max(wanted, 1))  # queries a FAISS call
        parts = [self._search_codes(queries[i:i + per_call], codes[i:i + per_call], k, wanted)
                 for i in range(0, len(queries), per_call)]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _search_codes(self, queries: np.ndarray, codes: np.ndarray, k: int,
                      wanted: int) -> tuple[np.ndarray, np.ndarray]:
        hamming, ids = self.index.search(codes, wanted)
        # NOTE: an IVF finds candidates only in the lists it probes (nprobe 1 of 32 gave ~80 of 500), an HNSW about
        # efSearch of them (16: ~600 of 2000)
        hamming, ids = searched_again(self._widening(wanted), codes, wanted, hamming, ids, self._wider(wanted))
        short = np.flatnonzero((ids >= 0).sum(axis=1) < wanted)
        if len(short) and (self.hash_bits or self.is_graph) and self.rescore_vectors is not None:
            # NOTE: a hash index finds candidates only in the buckets within nflip flips of the query's hash (nflip 0,
            # FAISS's default: its own bucket, which answered k=10 of 3000 vectors with 4 hits), an HNSW no node that
            # no other node links to, at any efSearch (BHNSW4 answered k=500 of 500 with 499): those left short get
            # every vector's Hamming distance
            hamming[short], ids[short] = self._hamming_scan(codes[short], wanted)
        self._check_ids(ids)
        if not self.rescore:
            scores = hamming.astype(np.float32)
            return (1.0 - 2.0 * scores / self.d if self.metric == "ip" else scores)[:, :k], ids[:, :k]
        out_scores = np.full((len(queries), k), -np.inf if self.metric == "ip" else np.inf, dtype=np.float32)
        out_ids = np.full((len(queries), k), -1, dtype=np.int64)
        for q, (query, row) in enumerate(zip(queries, ids)):
            scores, found = self._rescored(query, np.sort(row[row >= 0]), k)
            out_scores[q, : len(found)] = scores
            out_ids[q, : len(found)] = found
        return out_scores, out_ids

    def _check_ids(self, ids: np.ndarray) -> None:
        """Every candidate FAISS returned is a vector of the index or its -1 padding, else ``BadInputError`` naming the
        file, as ``IndexReader._check_ids`` says it. NOTE: only a damaged index body (an IVF list's ids, past the
        head/tail checks) returns another; rescoring took its row of rescore.npy: an IndexError traceback (exit 1)."""
        wrong = ids[(ids < -1) | (ids >= self.ntotal)]
        if len(wrong):
            where = quote_path(self.source) if self.source is not None else INDEX_FILE
            raise BadInputError(f"{where} returned vector id {int(wrong[0])} of {self.ntotal}: the index is corrupt; "
                                "run petal verify and rebuild it")

    def _widening(self, wanted: int) -> Callable[[np.ndarray, Any], tuple[np.ndarray, np.ndarray]]:
        """A search of ``wanted`` candidates for query codes with the FAISS search parameters given (the index's own
        nprobe or efSearch is shared by every thread: left as it is)."""

        def search(codes: np.ndarray, params: Any) -> tuple[np.ndarray, np.ndarray]:
            return self.index.search(codes, wanted, params=params)

        return search

    def _wider(self, wanted: int) -> Iterator[Any]:
        """FAISS search parameters for a search left short of its ``wanted`` candidates, 4x wider a step: an IVF's
        lists probed, up to every list; an HNSW's efSearch, from ``wanted`` up to the vectors held."""
        faiss = load_faiss()
        if self.nlist:
            nprobe = max(1, int(self.index.nprobe))
            while nprobe < self.nlist:
                nprobe = min(self.nlist, 4 * nprobe)
                yield faiss.SearchParametersIVF(nprobe=nprobe)
        elif isinstance(self.index, faiss.IndexBinaryHNSW):
            ef = max(1, int(self.index.hnsw.efSearch))
            while ef < self.ntotal:
                ef = min(self.ntotal, max(4 * ef, wanted))
                yield faiss.SearchParametersHNSW(efSearch=ef)

    def _hamming_scan(self, codes: np.ndarray, wanted: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``wanted`` nearest of every vector by Hamming distance to ``codes`` (``(hamming, ids)``, ties on the
        lower id), from the sign bits of ``rescore.npy``'s rows, ``RESCORE_ROWS`` at a time.

        NOTE: signbit, not ``>= 0``: a float below ~3e-8 in magnitude is a signed 0 in float16, whose sign is still the
        float32 vector's (only an exact -0.0 in the float32 vector, whose index bit is 1, reads as 0 here)."""
        faiss = load_faiss()
        assert self.rescore_vectors is not None
        best = np.empty((len(codes), 0), dtype=np.int32)
        best_ids = np.empty((len(codes), 0), dtype=np.int64)
        for start in range(0, self.ntotal, RESCORE_ROWS):
            rows = np.asarray(self.rescore_vectors[start:start + RESCORE_ROWS])
            flat = faiss.IndexBinaryFlat(self.d)
            flat.add(np.packbits(~np.signbit(rows), axis=1))
            hamming, ids = flat.search(codes, min(wanted, len(rows)))
            hamming, ids = np.concatenate([best, hamming], axis=1), np.concatenate([best_ids, ids + start], axis=1)
            order = np.lexsort((ids, hamming), axis=1)[:, :wanted]
            best, best_ids = np.take_along_axis(hamming, order, axis=1), np.take_along_axis(ids, order, axis=1)
        return best, best_ids

    def _rescored(self, query: np.ndarray, candidates: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The best ``k`` of ``candidates`` (ascending ids) by float similarity: ``(scores, ids)``, best first; ties
        keep the lower id. Scored ``RESCORE_ROWS`` at a time, keeping the best ``k`` so far."""
        assert self.rescore_vectors is not None
        best_scores = np.empty(0, dtype=np.float32)
        best_ids = np.empty(0, dtype=np.int64)
        for start in range(0, len(candidates), RESCORE_ROWS):
            chunk = candidates[start:start + RESCORE_ROWS]
            # NOTE: fancy indexing a memmap reads only the candidates' rows from disk (sorted: sequential reads).
            vectors = np.asarray(self.rescore_vectors[chunk], dtype=np.float32)
            # NOTE: an elementwise product summed a row at a time gives a row the same score wherever it sits in a
            # chunk (a BLAS matrix-vector product need not: equal vectors could rank by their position)
            if self.metric == "ip":
                scores = (vectors * query).sum(axis=1)
            else:
                scores = ((vectors - query) ** 2).sum(axis=1)
            # the best so far come first (their ids are lower), so a stable sort keeps ties on the lower id
            scores = np.concatenate([best_scores, scores.astype(np.float32, copy=False)])
            found = np.concatenate([best_ids, chunk])
            order = np.argsort(-scores if self.metric == "ip" else scores, kind="stable")[:k]
            best_scores, best_ids = scores[order], found[order]
        return best_scores, best_ids


def open_binary_index(version_dir: Path, manifest: Manifest, nprobe: int | None = None,
                      rescore: int | None = None) -> BinaryIndex:
    """Open ``version_dir``'s binary index (its files already checked by ``IndexReader``), memory-mapped."""
    from petal.pipeline.index.mmap import read_binary_index_mapped

    path = rescore_path(version_dir, manifest)  # NOTE: open_checks.py: what petal info checks too
    # NOTE: its size and head/tail checksum were checked with the other files (IndexReader, verify.py);
    # petal verify checks every byte.
    index = read_binary_index_mapped(version_dir / INDEX_FILE)
    vectors = rescore_vectors(path, int(index.ntotal), int(index.d))
    out = BinaryIndex(index, vectors, manifest.metric, DEFAULT_RESCORE if rescore is None else rescore,
                      source=version_dir / INDEX_FILE)
    params = dict(manifest.index.search_params)
    out.set_params(params if nprobe is None else {**params, "nprobe": nprobe})
    return out
