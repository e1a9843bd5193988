"""Opening a published index for search: checksums first, then FAISS, then id mapping."""

from __future__ import annotations

import json
import math
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.index.binary import RESCORE_FILE, open_binary_index
from petal.pipeline.index.checksums import sha256_file
from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.files import IDS_FILE, INDEX_FILE, IVFDATA_FILE, read_index
from petal.pipeline.index.open_checks import open_ids
from petal.pipeline.index.plan import searched_nodes
from petal.pipeline.index.read_errors import host_failure, read_failure
from petal.pipeline.index.row_groups import RowGroups
from petal.pipeline.index.tune import apply_params
from petal.pipeline.index.verify import OpenCheck, check_on_open
from petal.pipeline.index.widen import EF_FLOOR, CodeScan, decodable, searched_again
from petal.pipeline.ingest.exact_columns import read_group_fields
from petal.pipeline.ingest.int96 import open_parquet
from petal.pipeline.ingest.remote import is_uri, open_stored, remote_sha256, stat_remote
from petal.pipeline.layout import VersionLease, current_pointer, denied, is_denied, resolve_index_dir
from petal.pipeline.manifest import Manifest
from petal.pipeline.reliability.errors import (
    BadInputError,
    ConfigError,
    PetalError,
    PetalIOError,
    TemporaryFailure,
    one_line,
    quote_path,
    quote_text,
)
from petal.pipeline.reliability.faults import fault
from petal.pipeline.reliability.parquet_rows import check_rows
from petal.pipeline.store.outputs import FLOAT32_MAX, squared_norms

OPEN_ATTEMPTS = 3
# hits scored NaN or infinite whose stored vectors are looked at (_check_scores)
NONFINITE_CHECKED = 16
STORAGES = ("memory", "ondisk")
# NOTE: `where` expressions are a server's clients' to choose: a selector is a mask over every vector, so the
# cache keeps the most recently used few, not one per expression ever seen
MAX_SELECTORS = 32
SCAN_PAST_EF = 8  # a filtered HNSW search whose efSearch is over 1/8 of its vectors scans them instead (search())
K_FACTOR_CAP = 1024  # bounded_params: a refine's k_factor_rf (candidates k x this a query; the tuner writes <= 64)
# candidates (12 bytes each) a search again for a tie across the k-th hit asks of FAISS at a time (_ties_settled)
TIE_CANDIDATES = 1 << 22
_SELECTORS_LOCK = threading.Lock()
CTIME_SLACK_NS = 2_000_000_000  # _shard_unchanged: a ctime this far past the mtime is a change after the write


@dataclass(frozen=True)
class Hit:
    """One hit of a search, best first (``rank`` 1).

    ``score``: FAISS's score of the document for the query, under the index's metric: with ``--metric ip`` (the
    default) the inner product of the stored vectors (cosine for normalised ones; larger is closer), with ``l2``
    the squared L2 distance (smaller is closer). A binary index (``--quantize binary``) scores as its float
    vectors do after rescoring (``rescore`` > 0, the default); without it, ``1 - 2 * hamming / dim`` for ``ip``
    and the Hamming distance for ``l2``. ``faiss_id``: the vector's position in this version's index (what
    ``Index.texts`` checks). ``id``, ``shard``, ``row``: the document's id and where it was read. ``fields``: its
    ``--keep-columns`` values by column name (empty when none were kept). Hits compare equal when every field does,
    and hash by all but ``fields`` (a dict), so a set or dict of hits works (hits of several queries merged).
    """

    rank: int
    score: float
    faiss_id: int
    id: Any
    shard: str
    row: int
    # NOTE: hash=False: a frozen dataclass hashes every field, and a dict has no hash (set(hits) raised TypeError)
    fields: dict[str, Any] = field(default_factory=dict, hash=False)  # --keep-columns stored with the index


@dataclass(frozen=True)
class OversizedVector:
    """A hit scored beyond float32 because its stored vector's squared norm is (``squared_norm_overflows``): the
    index's vector, not the query, is too large. Only an index built before ``petal index`` skipped such a row
    (``vector_too_large``) holds one."""

    hit: Hit
    held_in: Path  # the file that holds the vector
    squared_norm: float

    def reason(self) -> str:
        """Why the query's scores overflow, for a message that names the query first."""
        return (f"its score against hit {quote_text(self.hit.id)} is beyond float32 because that stored vector is too "
                f"large, not the query: vector {self.hit.faiss_id} of {self.held_in} has a squared norm of "
                f"{self.squared_norm:.3g}, beyond float32's 3.4e38 (petal index now skips such a row, "
                "vector_too_large, but reuses what it stored before): run petal index --full again, or remove the "
                "id with petal index --delete IDS.parquet")


def import_for_serving() -> None:
    """Import now what opening and searching a version import at their first use: FAISS and its wrappers, the
    memory-mapped reader and its structure checks, filters, stored columns.

    A server calls it before it freezes what lives as long as the process (``cli/common.py``'s
    ``freeze_long_lived``), so these modules are frozen with the rest. Imported later, by the first version's open,
    they stayed in the oldest generation, walked by every full collection (FAISS alone: ~12k objects, 90% of what a
    CPU server of the packaged MiniLM left unfrozen; pandas, imported by pyarrow at a first filtered search, ~34k).
    """
    import numpy.ma  # noqa: F401  (numpy imports it at the first np.unique, which reading stored rows calls)

    # NOTE: pyarrow's first conversion of some values (to_pylist of a zoned timestamp, kept or read as metadata;
    # pa.array, pa.scalar) asks pandas whether they are its own, importing pandas where it is installed (~34k
    # objects, ~0.17 s on the 2-core machine): a server pays it here, once, rather than at a request, unfrozen
    pa.scalar(0)
    load_faiss()
    from petal.pipeline.index import columns_file, filter_values, filters, mmap, structure  # noqa: F401


def verify_files(version_dir: Path) -> OpenCheck:
    """The cheap checks of ``pipeline/index/verify.py`` before FAISS reads any file (O(1) in the index size):
    every listed file stays inside the version and is a regular file, opened without blocking."""
    return check_on_open(version_dir)


def is_binary_manifest(manifest: Manifest) -> bool:
    """The version's index is binary (``Manifest.binary_index``). NOTE: judged by the output alone, an index of a
    binary ``--index-factory`` over float output was opened as a float one and refused (65) by the header check."""
    return manifest.binary_index


def ignored_overrides(manifest: Manifest, nprobe: int | None, rescore: int | None) -> list[str]:
    """Search overrides that do nothing for this index, each as a sentence (``--nprobe`` on an exact index...)."""
    factory = manifest.index.factory
    binary = is_binary_manifest(manifest)
    notes = []
    if nprobe is not None and "IVF" not in factory.upper():
        notes.append(f"--nprobe {nprobe} is ignored: the index is {factory or 'not IVF'} (no inverted lists to probe)")
    if rescore is not None and not binary:
        notes.append(f"--rescore {rescore} is ignored: the index is {factory or 'not binary'}, only binary indexes "
                     "rescore")
    return notes


def bounded_params(params: dict[str, int], ntotal: int, ivf: Any) -> dict[str, int]:
    """``params`` with an HNSW's ``efSearch`` at most the vectors it holds (``ntotal``) and an IVF's HNSW quantizer's
    ``quantizer_efSearch`` at most its lists (``ivf.nlist``), or ``EF_FLOOR`` where that is more (the values the
    tuner writes, up to 4096, stay as the manifest says); a refine wrapper's ``k_factor_rf`` at most ``ntotal`` and
    ``K_FACTOR_CAP`` (the tuner writes up to 64); an IVF's ``nprobe`` at most its lists.

    NOTE: FAISS sizes each search's candidate heaps by efSearch: a manifest signed again with efSearch 2^31-1 (which
    opening takes: 1 to 2^31-1) made every query of a 300-vector index allocate 16 GiB for 34 s, and --nprobe N set
    quantizer_efSearch to 2N. Past a graph's node count a larger efSearch finds nothing more (every node fits in the
    heaps; FAISS searches at least k, and k and nprobe are at most ntotal and nlist), so the bound changes no result."""
    bounded = dict(params)
    if "efSearch" in bounded:
        bounded["efSearch"] = min(bounded["efSearch"], max(EF_FLOOR, ntotal))
    if "quantizer_efSearch" in bounded and ivf is not None:
        bounded["quantizer_efSearch"] = min(bounded["quantizer_efSearch"], max(EF_FLOOR, int(ivf.nlist)))
    if "nprobe" in bounded and ivf is not None:
        # NOTE: FAISS's fast-scan IVF search sizes its coarse results by nprobe, not by the lists there are: --nprobe
        # 10^8 on an IVF4,PQ8x4fs of 342 vectors took 3.9 GB, 2^31-1 was killed out of memory. Past nlist every list
        # is probed already
        bounded["nprobe"] = max(1, min(bounded["nprobe"], int(ivf.nlist)))
    if "k_factor_rf" in bounded:
        # NOTE: a refine wrapper asks its base index for k x k_factor_rf candidates of every query (FAISS allocates
        # them): 2^31-1 from a manifest signed again was gigabytes a query. The tuner writes at most 64; past
        # ntotal / k a larger factor finds nothing more, so a factor up to the vectors held, at most K_FACTOR_CAP
        bounded["k_factor_rf"] = max(1, min(bounded["k_factor_rf"], K_FACTOR_CAP, max(ntotal, 1)))
    return bounded


def ties_by_id(scores: np.ndarray, ids: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """``scores``, ``ids`` (``[num_queries, k]``, best first, -1 pad last) with hits of equal score in ascending id, as
    a binary index's rescoring orders them; every other order is FAISS's. A row with a NaN score is left as it is.

    NOTE: FAISS's result heaps leave ties in either order: a Flat index of a duplicated document answered the later
    copy first under ``ip`` and the earlier under ``l2``, and a query scoring every vector 0 got ids 3, 2, 1, 0."""
    better = -scores if metric == "ip" else scores
    pad = (ids < 0) | np.isnan(scores)
    order = np.lexsort((ids, np.where(pad, 0, better), pad), axis=1)
    keep = np.isnan(scores).any(axis=1)
    order[keep] = np.arange(ids.shape[1])
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1)


def tied_past(scores: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    """``[num_queries]`` bool: rows (``ties_by_id``'s order) wider than ``k`` whose last hit scores as their k-th: more
    vectors of that score may lie past them."""
    if scores.shape[1] <= k:
        return np.zeros(len(scores), dtype=bool)
    return (ids[:, -1] >= 0) & (scores[:, k - 1] == scores[:, -1])


def probing(params: dict[str, int], nprobe: int) -> dict[str, int]:
    """``params`` of an IVF index with ``nprobe`` lists probed, and its HNSW quantizer's ``quantizer_efSearch`` (where
    it has one) at least ``2 * nprobe``: the quantizer finds at most about efSearch lists."""
    probed = {**params, "nprobe": nprobe}
    if "quantizer_efSearch" in probed:
        probed["quantizer_efSearch"] = max(probed["quantizer_efSearch"], 2 * nprobe)
    return probed


class IndexReader:
    """A published version: manifest, FAISS index, id map, checked against the manifest's sizes and head/tail
    checksums (``pipeline/index/verify.py``) and memory-mapped (``pipeline/index/mmap.py``).

    Search parameters come from the manifest (tuned at build time); ``nprobe`` overrides.
    On-disk indexes are memory-mapped read-only.
    """

    TIE_PROBE = 1  # hits searched past k, where a tie across the k-th shows (_ties_settled)

    def __init__(self, path: Path, nprobe: int | None = None, rescore: int | None = None) -> None:
        for attempt in range(1, OPEN_ATTEMPTS + 1):
            pointer = current_pointer(path)
            try:
                self.dir, self.manifest = resolve_index_dir(path)
                try:
                    fault("query_open", self.dir)
                except OSError as exc:  # an injected I/O error: what opening's own would be (74)
                    raise PetalIOError(f"{quote_path(self.dir)}: {exc.strerror or exc}") from exc
                try:
                    # NOTE: held while this reader lives, so a re-index's pruning (--keep-versions) leaves the
                    # version on disk under a long-lived reader (query --stdin, the Python API, serve)
                    held = VersionLease(self.dir)
                except FileNotFoundError as exc:  # pruned since CURRENT was read
                    raise TemporaryFailure(f"{quote_path(self.dir)} was deleted while it was opened "
                                           "(re-indexing?); retry") from exc
                try:
                    self._open(nprobe, rescore)
                except BaseException:
                    held.release()
                    raise
                self._lease = held
                weakref.finalize(self, held.release)
                return
            except (OSError, RuntimeError, PetalError):
                # NOTE: a writer can publish a new version and prune this one between our reading CURRENT
                # and opening its files; CURRENT then names another, complete version: open that one.
                if attempt == OPEN_ATTEMPTS or current_pointer(path) == pointer:
                    raise

    def close(self) -> None:
        """Release the version's lease now (also when this reader is freed): pruning may delete it again."""
        self._lease.release()

    def _open(self, nprobe: int | None, rescore: int | None) -> None:
        """Open the version; a file the libraries cannot read or a malformed manifest field is a
        ``PetalError`` naming it (65 corrupt file, 74 I/O error, 78 manifest), never a traceback."""
        manifest_file = quote_path(self.dir / "manifest.json")
        try:
            self._load(nprobe, rescore)
        except PetalError:
            raise
        except OSError as exc:
            if exc.errno is None:  # pyarrow's decoding errors carry no errno
                raise BadInputError(f"{quote_path(exc.filename or self.dir)}: cannot be read ({one_line(str(exc))}); "
                                    "the version is corrupt: rebuild it") from exc
            if is_denied(exc):
                raise denied(exc.filename or self.dir) from exc
            raise PetalIOError(f"{quote_path(exc.filename or self.dir)}: {exc.strerror or exc}") from exc
        except pa.ArrowException as exc:  # NOTE: before MemoryError and RuntimeError, which some of them are
            raise read_failure(self.dir / IDS_FILE, "it", exc) from exc
        except MemoryError as exc:  # NOTE: the host's (74), not "the version is corrupt"
            raise read_failure(self.dir, "the version", exc) from exc
        except RuntimeError as exc:  # FAISS cannot parse index.faiss (its checksum matched the manifest)
            if host_failure(exc) is not None:  # NOTE: a file the host would not open or map: 74, not "corrupt"
                raise read_failure(self.dir / INDEX_FILE, "it", exc) from exc
            raise BadInputError(f"{quote_path(self.dir / INDEX_FILE)}: FAISS cannot read it "
                                f"({one_line(str(exc)).strip()[:200]}); the index is corrupt: rebuild it") from exc
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ConfigError(f"{manifest_file}: a field is missing or malformed ({type(exc).__name__}: "
                              f"{one_line(str(exc))[:120]}); the version is damaged: rebuild it") from exc

    def _load(self, nprobe: int | None, rescore: int | None) -> None:
        faiss = load_faiss()

        record = self.manifest.index
        self.ignored = ignored_overrides(self.manifest, nprobe, rescore)  # said on stderr by petal query
        self.open_check = verify_files(self.dir)
        self.storage = record.storage
        if self.storage not in STORAGES:
            raise ConfigError(f"{quote_path(self.dir / 'manifest.json')}: index storage {quote_text(self.storage)} is "
                              f"not one of {', '.join(STORAGES)}; the manifest is damaged: rebuild the version")
        # binary indexes (Hamming + float rescoring) open through pipeline/index/binary.py
        binary = is_binary_manifest(self.manifest)
        if binary:
            self.index = open_binary_index(self.dir, self.manifest, nprobe=nprobe, rescore=rescore)
        else:
            self.index = read_index(self.dir / INDEX_FILE, self.storage)
            decodable(self.index)  # NOTE: a fast-scan IVF read from a file segfaults FAISS's decoding without it
        # NOTE: only the footer is read here: a count that does not fit reads nothing, and the rows are decoded
        # per row group as hits fall in them (row_groups.py), so the open is O(1) in the number of ids (1M x 1024:
        # the whole id map took 0.15 s). ``shard`` repeats a few paths over every row: decoded as a dictionary.
        # The file is memory-mapped: a version pruned after this point still answers.
        # The count, the id columns and the stored ones the manifest records are checked (open_checks.py: what
        # petal info checks too, against the manifest).
        rows, self.id_map = open_ids(self.dir, self.manifest, int(self.index.ntotal))
        self.num_ids = rows.num_rows
        if not self.open_check.sealed:
            # NOTE: no trusted head/tail records (an old version, an edited manifest): opened as before issue 14,
            # every file hashed above and the whole id map decoded here, so damage anywhere in it is refused now
            self.id_map.table()
        self.columns = open_columns(rows, self.manifest)  # stored text and --keep-columns (None: older index)
        # shards --show-text found without the hits' rows (said by petal query), each with why: "gone" (no file
        # there), "changed" (rewritten since indexing: the row holds another id, or is past its end), "unreadable"
        self.missing_shards: dict[str, str] = {}
        self._unchanged_shards: dict[tuple[str, int, int, int, int], bool] = {}  # path, size, mtime, ctime, inode
        self._filesystems: dict[str, Any] = {}  # an object store's client by bucket (open_stored), for remote shards
        self._ivf: Any = None  # the IVF inside a float index (its parallel_mode is set per search)
        self._hnsw_ef: int | None = None  # the efSearch of the HNSW a float index searches through (else None)
        self._candidates_per_hit = 1  # a refine wrapper's k_factor_rf: its base index returns this many per hit
        self._graph_codes: Any = None  # a bare HNSW's vectors, where a filtered search may scan them (Flat, SQ)
        self._scan: CodeScan | None = None  # every vector under any wrappers, whatever their codes (_code_scan)
        params = dict(record.search_params)
        if binary:  # the binary index set its own nprobe
            self.search_params = params if nprobe is None else {**params, "nprobe": nprobe}
            return
        self._ivf = faiss.try_extract_index_ivf(self.index)
        if nprobe is not None and self._ivf is not None:
            params = probing(params, nprobe)
        params = bounded_params(params, int(self.index.ntotal), self._ivf)
        try:
            apply_params(self.index, params)
        except RuntimeError as exc:  # NOTE: not index.faiss's fault: the manifest names a parameter it has not
            reason = one_line(str(exc)).strip().rsplit(": ", 1)[-1][:120]
            raise ConfigError(f"{quote_path(self.dir / 'manifest.json')}: manifest key index.search_params "
                              f"{json.dumps(dict(record.search_params))[:120]} does not apply to its "
                              f"{quote_text(record.factory)} index (FAISS: {reason}); the version is damaged: "
                              "rebuild it") from exc
        self.search_params = params
        nodes = searched_nodes(self.index)
        hnsw = next((n for n in nodes if isinstance(n, faiss.IndexHNSW)), None)
        if hnsw is not None:
            self._hnsw_ef = int(hnsw.hnsw.efSearch)
            refined = isinstance(nodes[0], faiss.IndexRefine) and len(nodes) > 1 and hnsw is nodes[1]
            if hnsw is nodes[0] or refined:  # NOTE: a refine wrapper's own codes hold every vector too (RFlat: exact)
                codes = faiss.downcast_index(nodes[0].refine_index if refined else hnsw.storage)
                if isinstance(codes, (faiss.IndexFlat, faiss.IndexScalarQuantizer)):
                    self._graph_codes = codes  # NOTE: FAISS's PQ search takes no id selector
            refine = next((n for n in nodes if isinstance(n, faiss.IndexRefine)), None)
            if refine is not None:
                self._candidates_per_hit = max(1, math.ceil(params.get("k_factor_rf", refine.k_factor)))

    def _params_for(self, k: int, matches: int | None = None) -> dict[str, int]:
        """The search parameters of a search for ``k`` hits, where the tuned ones find fewer candidates than it needs:
        an HNSW's efSearch raised to the candidates the search must return (``k``, times a refine wrapper's
        ``k_factor_rf``); for a filter that ``matches`` that many vectors, an IVF's nprobe and an HNSW's efSearch (the
        larger of the tuned one and those candidates) times the vectors a match stands for, ``ntotal / matches`` (at
        most every list, every vector).

        NOTE: FAISS's HNSW search returns at most about efSearch candidates, not ``k``: with the tuned efSearch 16, a
        400-vector index answered k=400 with ~125 hits. The tuned values find enough candidates among every vector;
        among 1% of them, about 1% of that: a 1% filter on a 20k-vector IVF256 index had recall@10 0.8 (0.99
        unfiltered), and a filtered HNSW walk, which passes through the rows the filter rejects, found a filter's one
        row of 300 for 2 queries of 5 (``_widened`` searches again the queries left short)."""
        params = self.search_params
        spread = self.ntotal / matches if matches else 1.0  # NOTE: none: FAISS finds nothing at any setting
        if self._ivf is not None and spread > 1:
            nprobe = int(params.get("nprobe", self._ivf.nprobe))
            probed = min(int(self._ivf.nlist), math.ceil(nprobe * spread))
            if probed > nprobe:
                params = probing(params, probed)
        if self._hnsw_ef is not None:
            # NOTE: the tuned efSearch is what finds the top k among every vector (the recall target): a filter
            # widens it, not k (k x ntotal / matches alone had recall@1 0.94 where unfiltered had 0.985)
            candidates = max(int(params.get("efSearch", self._hnsw_ef)), k * self._candidates_per_hit)
            needed = min(math.ceil(candidates * spread), self.ntotal)
            if needed > self._hnsw_ef:
                params = {**params, "efSearch": needed}
        return params

    @property
    def ids(self) -> pa.Table:
        """The whole id map (``faiss_id``, ``id``, ``shard``, ``row``), decoded: O(ids); searches read only the
        row groups of their hits."""
        return self.id_map.table()

    @property
    def dim(self) -> int:
        return int(self.index.d)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def search(self, vectors: np.ndarray, k: int, where: str | None = None) -> list[list[Hit]]:
        """Top ``k`` hits per query row of ``vectors [num_queries, dim]`` (fewer if the index is smaller).

        ``where``: a filter on kept columns (``pipeline/index/filters.py``), applied inside the FAISS search;
        a bad expression or an unknown column is a ``FilterError`` (a ``ValueError``) naming it.
        """
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ConfigError(f"query vectors have shape {vectors.shape}, the index holds dim {self.dim}")
        k_eff = max(1, min(k, self.ntotal))
        if self.ntotal == 0:
            return [[] for _ in range(len(vectors))]
        selector = self.selector(where) if where else None
        self._parallel_for(len(vectors))
        queries = np.ascontiguousarray(vectors, dtype=np.float32)
        # NOTE: one hit past k, so that a tie across the k-th shows (_ties_settled)
        width = min(k_eff + self.TIE_PROBE, self.ntotal)
        scores, ids = ties_by_id(*self._found(queries, width, selector), self.manifest.metric)
        scores, ids = self._ties_settled(queries, k_eff, scores, ids, selector)
        valid = ids >= 0  # NOTE: FAISS pads with -1 when fewer than k results exist
        self._check_ids(ids)
        self._check_scores(queries, scores, ids)
        return self._hits(scores, ids, valid, ids[valid])

    def _check_ids(self, ids: np.ndarray) -> None:
        """Every id FAISS returned is a vector of the index or its -1 padding, else ``BadInputError`` naming the file
        that holds the ids. NOTE: only a damaged index body returns such an id (the open checks read heads and
        tails); one below -1 is no padding either: dropped, its hit would be lost without a word. Checked on every
        answer FAISS gives, before a row that looks short is searched again (a wider search or a scan that leaves
        the damaged entry out would hide it)."""
        wrong = ids[(ids < -1) | (ids >= self.num_ids)]
        if len(wrong):
            held_in = IVFDATA_FILE if self.storage == "ondisk" else INDEX_FILE  # the file whose lists hold the ids
            raise BadInputError(f"{self.dir / held_in} returned vector id {int(wrong[0])} of {self.num_ids}: "
                                "the index is corrupt; run petal verify and rebuild it")

    def _check_scores(self, queries: np.ndarray, scores: np.ndarray, ids: np.ndarray) -> None:
        """A hit scored NaN or infinite for a finite query whose stored vector holds NaN or infinite values:
        ``BadInputError`` naming the file that holds it. NOTE: petal never stores such a vector (a run refuses it),
        so only a damaged index body holds one (the open checks read heads and tails); its score was a query's
        fault (``ScoresOverflowError``: 'scale it down', exit 2 from the Python API) or, for a text query, printed
        as nan. A non-finite score of a finite stored vector is left to the caller (``oversized_hit`` tells whether the
        stored vector or the query is too large)."""
        bad = np.argwhere(~np.isfinite(scores) & (ids >= 0))
        for row, col in bad[:NONFINITE_CHECKED]:
            if not np.isfinite(queries[row]).all():
                continue
            vector_id = int(ids[row, col])
            vector, held_in = self._stored_vector(vector_id)
            if vector is not None and not np.isfinite(vector).all():
                raise BadInputError(f"{self.dir / held_in}: vector {vector_id} holds NaN or infinite values (it "
                                    f"scored {float(scores[row, col])}): the index is corrupt; run petal verify and "
                                    "rebuild it")

    def oversized_hit(self, hits: list[Hit]) -> OversizedVector | None:
        """The first of one query's ``hits`` scored NaN or infinite whose stored vector is too large to score (its
        squared norm beyond float32), else ``None`` (the query's values are what overflow). At most
        ``NONFINITE_CHECKED`` such hits are looked at (an IVF index without a direct map: O(vectors) each)."""
        for hit in [hit for hit in hits if not math.isfinite(hit.score)][:NONFINITE_CHECKED]:
            vector, held_in = self._stored_vector(hit.faiss_id)
            squared = float(squared_norms(vector[None, :])[0]) if vector is not None else 0.0
            if squared > FLOAT32_MAX:  # as squared_norm_overflows
                return OversizedVector(hit, self.dir / held_in, squared)
        return None

    def _stored_vector(self, vector_id: int) -> tuple[np.ndarray | None, str]:
        """The vector ``vector_id`` as the index scores it (decoded; a binary index's rescoring row), and the file
        that holds it; ``None`` where the index cannot give it back. An IVF index without a direct map is looked up
        in its lists (O(vectors): only for a hit that scored NaN or infinite)."""
        if is_binary_manifest(self.manifest):
            rows = getattr(self.index, "rescore_vectors", None)
            return (None if rows is None else np.asarray(rows[vector_id], np.float32)), RESCORE_FILE
        held_in = IVFDATA_FILE if self.storage == "ondisk" else INDEX_FILE
        index: Any = self.index  # a FAISS index here (binary ones returned above)
        try:
            return index.reconstruct(vector_id), held_in
        except RuntimeError:  # an IVF index keeps no direct map
            pass
        ivf = self._ivf
        if ivf is None:
            return None, held_in
        faiss = load_faiss()
        lists = ivf.invlists
        for number in range(int(ivf.nlist)):
            size = int(lists.list_size(number))
            if not size:
                continue
            at = np.flatnonzero(faiss.rev_swig_ptr(lists.get_ids(number), size) == vector_id)
            if len(at):
                vector = np.empty(int(ivf.d), np.float32)
                try:
                    ivf.reconstruct_from_offset(number, int(at[0]), faiss.swig_ptr(vector))
                except RuntimeError:
                    return None, held_in
                return vector, held_in
        return None, held_in

    def _found(self, queries: np.ndarray, k: int, selector: Any) -> tuple[np.ndarray, np.ndarray]:
        """FAISS's ``(scores, ids)`` (``[num_queries, k]``, -1 pad) for ``queries``, filtered by ``selector`` (an
        ``IdSelector``) when there is one, the queries left short searched again (``_widened``)."""
        search_params = self._params_for(k, None if selector is None else min(selector.count, self.ntotal))
        if selector is not None:
            params = selector.params(self.index, search_params)
        elif search_params is self.search_params:
            params = None  # NOTE: the index's own parameters, set when it opened
        else:  # this k needs more candidates than they give
            from petal.pipeline.index.filters import search_parameters

            params = search_parameters(self.index, search_params)
        if selector is not None and self._graph_codes is not None and \
                search_params.get("efSearch", 0) * SCAN_PAST_EF >= self.ntotal:
            # NOTE: a filter this selective walks much of the graph, computing distances to every node it passes (100
            # ms a query for 60 matches of 60k vectors); FAISS's scan of its vectors with the same selector computes
            # them for the matches alone: the exact top k, with the graph's distances, in ~1 ms
            codes = self._graph_codes
            scores, ids = codes.search(queries, k, params=selector.params(codes, {}))
        elif params is None:
            scores, ids = self.index.search(queries, k)
        else:
            try:
                # NOTE: binary indexes never get here: selector() refuses them. (FAISS's SWIG stubs omit the
                # `params` keyword that its Python wrapper of Index.search takes: hence the ignore.)
                scores, ids = self.index.search(queries, k, params=params)  # type: ignore[call-arg]
            except RuntimeError as exc:  # an index type whose search takes no selector (LSH, NSG, fast scan...)
                from petal.pipeline.index.filters import FilterError

                reason = one_line(str(exc)).strip().rsplit("failed: ", 1)[-1][-100:]
                raise FilterError(f"--where: a {self.manifest.index.factory or 'FAISS'} index cannot filter in its "
                                  f"search (FAISS: {reason}); rebuild it with a Flat, IVF or HNSW --index-factory "
                                  "(petal rebuild OUT --index-factory ...)") from exc
        return self._widened(queries, k, scores, ids, search_params, selector)

    def _ties_settled(self, queries: np.ndarray, k: int, scores: np.ndarray, ids: np.ndarray,
                      selector: Any) -> tuple[np.ndarray, np.ndarray]:
        """``scores``, ``ids`` (ordered by ``ties_by_id``, at least ``k`` wide) cut to ``k``, the rows whose hits past
        the k-th tie with it searched again, 4x wider a step, until the tie ends inside them or they hold every vector:
        of hits tied across the k-th, the lowest ids are kept.

        NOTE: FAISS keeps any of the vectors tied at its k-th score: with a document in two shards, k=1 answered the
        later copy (HNSW8), and a Flat or IVF search at k=5 kept the later copy of a pair tied at the 5th score."""
        out_scores, out_ids = scores[:, :k].copy(), ids[:, :k].copy()
        rows = np.flatnonzero(tied_past(scores, ids, k))
        width = scores.shape[1]
        while len(rows) and width < self.ntotal:
            width = min(self.ntotal, 4 * width)
            per_call = max(1, TIE_CANDIDATES // width)  # NOTE: a zero query ties every vector under ip
            still = []
            for start in range(0, len(rows), per_call):
                part = rows[start:start + per_call]
                found_scores, found_ids = ties_by_id(*self._found(queries[part], width, selector), self.manifest.metric)
                out_scores[part], out_ids[part] = found_scores[:, :k], found_ids[:, :k]
                still.append(part[tied_past(found_scores, found_ids, k)])
            rows = np.concatenate(still)
        return out_scores, out_ids

    def _widened(self, queries: np.ndarray, k: int, scores: np.ndarray, ids: np.ndarray,
                 search_params: dict[str, int], selector: Any) -> tuple[np.ndarray, np.ndarray]:
        """An IVF or HNSW search's answers, the queries answered with fewer than ``k`` hits (or than the documents
        ``selector`` matches) searched again with wider parameters (``_wider``) until they have them or the
        parameters reach every vector: k hits, as an exact index gives them.

        NOTE: FAISS's IVF search looks only in the nprobe lists nearest the query: a 400-vector IVF16 index at
        nprobe 1 answered k=400 with the ~30 vectors of one list (and a ``--where`` search with the matches in it).
        Its filtered HNSW search walks through the rows the filter rejects and stops after about efSearch candidates
        of any kind: at efSearch 16, a filter matching one row of 300 found it for 2 queries of 5."""
        from petal.pipeline.index.filters import search_parameters

        def search(rows: np.ndarray, wider: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
            params = search_parameters(self.index, wider, None if selector is None else selector.selector)
            return self.index.search(rows, k, params=params)  # type: ignore[call-arg]

        want = k if selector is None else min(k, selector.count)
        self._check_ids(ids)
        scores, ids = searched_again(search, queries, want, scores, ids, self._wider(search_params))
        self._check_ids(ids)
        short = np.flatnonzero((ids >= 0).sum(axis=1) < want)
        if len(short) and not is_binary_manifest(self.manifest):
            # NOTE: a node no other node links to is reached by no walk, at any efSearch: 500 vectors in HNSW8 under
            # l2 answered k=500 with 497 hits (HNSW4: 482), HNSW4,PQ8 a filter matching 244 rows with 238; an IVF
            # whose quantizer is such a graph never probes a list no walk reaches (IVF256_HNSW4,PQ8 under l2: k=3000
            # of 3000 gave 2997, and a filter whose matches lie in such lists, fewer than k or none); a fast-scan
            # index answers a zero query under ip with NaN and no ids. Those still short scan every vector
            # (CodeScan: an IVF's every list, else the codes decoded), under id maps, pre-transforms, refine wrappers
            found_scores, found_ids = self._code_scan().search(queries[short], k,
                                                               None if selector is None else selector.member)
            # NOTE: only where it finds more: FAISS's fast scan of every list may drop hits its search kept
            more = short[(found_ids >= 0).sum(axis=1) > (ids[short] >= 0).sum(axis=1)]
            better = np.isin(short, more)
            scores[more], ids[more] = found_scores[better], found_ids[better]
        return scores, ids

    def _code_scan(self) -> CodeScan:
        """The index's ``CodeScan``, made at its first use (it reads an id map's ids: O(ids), not at opening)."""
        if self._scan is None:
            self._scan = CodeScan(self.index)
        return self._scan

    def _wider(self, search_params: dict[str, int]) -> Iterator[dict[str, int]]:
        """``search_params`` widened 4x a step until they reach every vector: an IVF's lists probed (its HNSW
        quantizer's efSearch with them), up to every list; an HNSW's efSearch, up to the vectors held (every node
        its graph reaches); nothing for other indexes, which search every vector they hold."""
        if self._ivf is not None:
            nlist = int(self._ivf.nlist)
            nprobe = int(search_params.get("nprobe", self._ivf.nprobe))
            while nprobe < nlist:
                nprobe = min(nlist, 4 * nprobe)
                yield probing(search_params, nprobe)
        elif self._hnsw_ef is not None:
            ef = max(1, int(search_params.get("efSearch", self._hnsw_ef)))
            while ef < self.ntotal:
                ef = min(self.ntotal, 4 * ef)
                yield {**search_params, "efSearch": ef}

    def _hits(self, scores: np.ndarray, ids: np.ndarray, valid: np.ndarray, flat: np.ndarray) -> list[list[Hit]]:
        """The hits of a search (``ids [nq, k]``, -1 where FAISS found none; ``flat``: the valid ones, row by row),
        each with its kept columns, built in one pass: every hit's id, shard and row in one bulk lookup, its
        fields in one read, then one ``Hit`` each (``dataclasses.replace`` per hit to add the fields cost ~8 us
        a hit)."""
        doc_ids, shards, shard_rows = self.id_map.lookup(flat)
        names = self.kept_columns
        fields: list[dict[str, Any]] | None = None
        if self.columns is not None and names and len(flat):
            fields = self.columns.rows(flat.tolist(), names)
        score_rows = np.asarray(scores, dtype=np.float64).tolist()  # float(score) each, as Hit.score always was
        out: list[list[Hit]] = []
        cursor = 0
        for q, (row_ids, row_valid) in enumerate(zip(ids.tolist(), valid.tolist())):
            hits = []
            for rank, (score, fid, ok) in enumerate(zip(score_rows[q], row_ids, row_valid), start=1):
                if not ok:
                    continue
                hits.append(Hit(rank, score, fid, doc_ids[cursor], shards[cursor], shard_rows[cursor],
                                {} if fields is None else fields[cursor]))
                cursor += 1
            out.append(hits)
        return out

    def _parallel_for(self, num_queries: int) -> None:
        """IVF: a lone query's inverted lists are scanned by every OpenMP thread (FAISS ``parallel_mode`` 1).

        FAISS splits a search over its queries (mode 0), so a lone query scans its lists on one thread.
        Measured on the H200 host (16 threads, 1M x 1024 in IVF4096,Flat; ``bench/lone_request_probe.py
        coarse``): a lone query 1.22 -> 0.83 ms at nprobe 8, 2.09 -> 0.95 at 16, 7.14 -> 1.34 at 64.
        Several queries keep mode 0: mode 1 runs them one after another. Both modes compute the same
        distances and the same top k.
        NOTE: the mode is a field of the shared index, set before each search: a search running in
        another thread may read the other mode, which changes only how it is parallelised (an exact tie
        at the k-th score may then keep another of the tied rows).
        """
        if self._ivf is None:  # not IVF, or a binary index
            return
        mode = 1 if num_queries == 1 and load_faiss().omp_get_max_threads() > 1 else 0
        if self._ivf.parallel_mode != mode:
            self._ivf.parallel_mode = mode

    def selector(self, where: str) -> Any:
        """The FAISS id selector of ``where`` (the ``MAX_SELECTORS`` most recently used are cached); ``FilterError``
        naming what is wrong with it (its text, a column, a literal, an index that cannot filter)."""
        with _SELECTORS_LOCK:
            cache: OrderedDict[str, Any] = self.__dict__.setdefault("_selectors", OrderedDict())
            if where in cache:
                cache.move_to_end(where)
                return cache[where]
        from petal.pipeline.index.filters import FilterError, IdSelector, columns_problem, filter_mask, parse_filter

        flt = parse_filter(where)
        names = self.kept_columns
        problem = columns_problem(flt, names, self.columns is not None, is_binary_manifest(self.manifest))
        if problem is not None:
            raise FilterError(problem)
        # NOTE: from the file opened with the version, not by path: a version a server still searches may have
        # been pruned since (a newer one was refused)
        table = self.columns.read(flt.columns)
        selector = IdSelector(filter_mask(flt, table, names))
        with _SELECTORS_LOCK:
            cache[where] = selector
            while len(cache) > MAX_SELECTORS:
                cache.popitem(last=False)
        return selector

    @property
    def kept_columns(self) -> list[str]:
        return list(self.manifest.kept_columns)

    def _open_shard(self, shard: str) -> pq.ParquetFile:
        """The shard at ``shard`` (a local path, or an object's URI: read by ranges through its filesystem, with the
        storage's standard credentials as the index run read it); ``FileNotFoundError`` when it is gone.

        NOTE: an object's URI was taken for a local path (``Path("s3://...").is_file()`` is never true), so every
        hit of an S3 shard had no text or metadata, as if its shard were gone."""
        if is_uri(shard):
            remote = open_stored(shard, self._filesystems)
            return open_parquet(remote.open(), page_checksum_verification=True)
        if not Path(shard).is_file():  # NOTE: gone, or a FIFO now: never opened (it would block)
            raise FileNotFoundError(shard)
        return open_parquet(shard, page_checksum_verification=True)

    def _shard_unchanged(self, abs_path: str) -> bool:
        """The shard at ``abs_path`` (a file, or an object's URI) is the one this version indexed: its size and
        modification time as the manifest records them, or (touched or copied since: another time) its sha256 (an
        object's content identity, ``remote_sha256``). Remembered per file state, so a shard is hashed at most once
        while it stays as it is."""
        content: Callable[[], str]
        if is_uri(abs_path):
            remote = open_stored(abs_path, self._filesystems)
            stored = stat_remote(remote)
            size, mtime_ns = stored.st_size, stored.st_mtime_ns
            key = (abs_path, size, mtime_ns, 0, 0)
            written_then = True  # NOTE: a store gives every write of an object a new time
            content = lambda: remote_sha256(remote, size, mtime_ns)
        else:
            st = os.stat(abs_path)
            size, mtime_ns = st.st_size, st.st_mtime_ns
            key = (abs_path, size, mtime_ns, st.st_ctime_ns, st.st_ino)
            # NOTE: size and mtime are trusted only for a file last changed when it was last written (ctime within
            # CTIME_SLACK_NS of mtime): one rewritten with its old mtime put back (cp -p, rsync -t, tar, touch -d)
            # has a later ctime, and gave another document's columns as a hit's metadata; such a file is hashed.
            # Both ways: an mtime set ahead of the ctime (touch -d tomorrow, a skewed clock) was trusted
            written_then = abs(st.st_ctime_ns - st.st_mtime_ns) <= CTIME_SLACK_NS
            content = lambda: sha256_file(abs_path)
        known = self._unchanged_shards
        if key not in known:
            record = next((s for s in self.manifest.shards if s.abs_path == abs_path), None)
            known[key] = record is not None and size == record.size and (
                (mtime_ns == record.mtime_ns and written_then) or content() == record.sha256)
        return known[key]

    def texts(self, hits: list[Hit], text_column: str) -> list[str | None]:
        """The text of each hit: stored with the index, or (an index without stored text) read back from its
        shard by the absolute path the manifest records; ``None`` where the shard is gone, changed or unreadable
        (in ``missing_shards``)."""
        if self.columns is not None and "text" in self.columns.names:
            return [row["text"] for row in self.columns.rows([h.faiss_id for h in hits], ["text"])]
        return [None if r is None else r.get(text_column) for r in self.records(hits, [text_column])]

    def records(self, hits: list[Hit], columns: list[str] | None = None,
                exclude: tuple[str, ...] = ()) -> list[dict[str, Any] | None]:
        """Each hit's row of its shard (``columns``, or every column but ``exclude``), ``None`` where the row is gone.
        Only the row groups holding hits are read, and of them only those columns (and the id column, for the check
        below): a shard's vectors or text column, left out, is never decoded. Shards are found by the absolute path
        the manifest records; gone or unreadable ones land in ``missing_shards``, and so do shards whose row no
        longer holds the hit's id (rewritten since indexing: the row is another document's), each with why."""
        by_shard: dict[str, list[Hit]] = {}
        located = shard_locations(self.manifest)
        for hit in hits:
            by_shard.setdefault(located.get(hit.shard, hit.shard), []).append(hit)
        found: dict[tuple[str, int], dict[str, Any] | None] = {}
        id_column = self.manifest.columns.id_column
        for shard, shard_hits in by_shard.items():
            try:
                pf = self._open_shard(shard)
                names = pf.schema_arrow.names
                # NOTE: without the id column now, a row cannot show whose it is: a hit whose id came from that
                # column (the shard has lost it since) is "changed"; a positional id (<shard>:<row>, the shard had
                # no id column) is given only while the file is the one indexed (_shard_unchanged)
                checked = id_column in names
                if not checked and not (all(_positional(hit) for hit in shard_hits) and self._shard_unchanged(shard)):
                    self.missing_shards.setdefault(shard, "changed")
                    for hit in shard_hits:
                        found[(shard, hit.row)] = None
                    continue
                wanted = [i for i, name in enumerate(names)
                          if (name in columns if columns is not None else name not in exclude)]
                returned = {names[i] for i in wanted}
                read = wanted if not checked or id_column in returned else sorted(
                    [*wanted, *(i for i, name in enumerate(names) if name == id_column)])
                starts = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)])
                groups: dict[int, pa.Table] = {}
                for hit in shard_hits:
                    row = hit.row
                    group = int(np.searchsorted(starts, row, side="right")) - 1
                    if not 0 <= group < pf.num_row_groups:
                        found[(shard, row)] = None
                        self.missing_shards.setdefault(shard, "changed")
                        continue
                    if group not in groups:  # read only the row groups holding hits
                        groups[group] = _read_fields(pf, group, read)
                    record = _record(groups[group].slice(row - int(starts[group]), 1))
                    # NOTE: the shard may have been rewritten since indexing (rows reordered, removed, added): the
                    # row the index recorded is then another document's, whose text or metadata must not be given
                    # as the hit's; where the shard has the id column, the row must still hold the hit's id
                    if checked and not _same_id(record.get(id_column), hit.id):
                        found[(shard, row)] = None
                        self.missing_shards.setdefault(shard, "changed")
                        continue
                    if id_column not in returned:  # the id column, read for the check only
                        record.pop(id_column, None)
                    found[(shard, row)] = record
            except (OSError, pa.ArrowException, KeyError) as exc:
                gone = isinstance(exc, FileNotFoundError) or (not is_uri(shard) and not Path(shard).exists())
                self.missing_shards.setdefault(shard, "gone" if gone else "unreadable")
                for hit in shard_hits:
                    found[(shard, hit.row)] = None
        return [found.get((located.get(h.shard, h.shard), h.row)) for h in hits]


def _read_fields(pf: pq.ParquetFile, group: int, fields: list[int]) -> pa.Table:
    """Row group ``group`` of ``pf`` with only its top-level fields at ``fields`` (positions in ``schema_arrow``)
    decoded: by position, never by name (``read_group_fields``: a dotted name is also a struct child's path), every
    row the footer counts (``parquet_rows``)."""
    table = read_group_fields(pf, group, fields)
    check_rows(table.num_rows, pf.metadata.row_group(group).num_rows)
    return table


def _record(row: pa.Table) -> dict[str, Any]:
    """The one row of ``row`` as Python values, bytes and text that is not UTF-8 decoded with U+FFFD (a shard's
    metadata column, which ``petal index`` never reads: ``lenient_pylist``)."""
    from petal.pipeline.index.columns_file import lenient_pylist

    return {k: v.decode("utf-8", "replace") if isinstance(v, bytes) else v for k, v in lenient_pylist(row)[0].items()}


def _positional(hit: Hit) -> bool:
    """``hit``'s id is its place (``<shard>:<row>``: its shard had no id column when it was indexed)."""
    return isinstance(hit.id, str) and hit.id == f"{hit.shard}:{hit.row}"


def _same_id(value: Any, hit_id: Any) -> bool:
    """A shard row's id value is the hit's id, as the index stores ids (integer ids of a shard among string ones
    as their text)."""
    if value is None:
        return False
    if isinstance(hit_id, bytes):
        hit_id = hit_id.decode("utf-8", "replace")
    return bool(value == hit_id) or str(value) == str(hit_id)


def shard_locations(manifest: Manifest) -> dict[str, str]:
    """Shard path as recorded with the ids -> its absolute path (the manifest's), so the working directory
    does not matter."""
    located = {s.path: s.abs_path for s in manifest.shards}
    by_name: dict[str, list[str]] = {}
    for abs_path in located.values():
        by_name.setdefault(Path(abs_path).name, []).append(abs_path)
    for path in list(located):  # a path typed differently by an earlier run: by file name when unique
        located.setdefault(Path(path).name, located[path])
    return {**{name: paths[0] for name, paths in by_name.items() if len(paths) == 1}, **located}


def open_columns(rows: RowGroups, manifest: Manifest) -> Any:
    """The version's stored columns (text, --keep-columns: in ``ids.parquet``), or ``None`` (an older index); the
    columns the manifest records were checked to be there by ``open_checks.open_ids``."""
    recorded = manifest.stored
    if recorded is None:
        return None
    from petal.pipeline.index.columns_file import ColumnsReader

    return ColumnsReader(rows, (["text"] if recorded.text else []) + list(recorded.keep))
