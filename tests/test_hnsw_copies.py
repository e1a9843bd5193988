"""Exact copies of a vector (boilerplate, duplicate documents) are all found, and every HNSW node stays reached.

FAISS's pruning never drops a link to an exact copy, so a vector with more than 2·M copies had copies whose links
led only to each other: whole groups were cut off from the graph's entry point, and the repair linked each from
the entry point into one slot, overwriting the link it had made before (200 vectors x 20 copies under HNSW8: 474
nodes never reached, 31 of 200 searches for those vectors missed some of their 20 copies). Now copies are linked
as one point and each unreached node is spliced in (``h -> t`` becomes ``h -> u -> t``), which never cuts a reached
node off (pipeline/index/graph_repair.py); ``petal verify`` refuses a graph with unreached nodes. Real Parquet,
real FAISS, the API and the ``petal`` command.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.index import graph_repair
from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.graph_holdout import hnsw_graph
from petal.pipeline.index.graph_repair import Level0, link_unreachable
from tests._open_audit_shared import resign
from tests.conftest import REPO

DIM = 16
# NOTE: copies among distinct documents, as a corpus has them; "only copies": the audit's case, every vector 20 times
LAYOUTS = {"20 copies": [20] * 30 + [1] * 1000, "40 copies": [40] * 15 + [1] * 1000,
           "mixed": [1, 2, 5, 9, 17, 33, 65, 120] * 3 + [1] * 600, "only copies": [20] * 200, "all the same": [400]}


def _copies(sizes: list[int], seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(points [len(sizes), DIM], vectors [sum(sizes), DIM])``: point ``g`` repeated ``sizes[g]`` times, in order."""
    points = np.random.default_rng(seed).standard_normal((len(sizes), DIM)).astype(np.float32)
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    return points, np.repeat(points, sizes, axis=0)


def unreached_nodes(index) -> int:
    """The nodes of ``index``'s HNSW graph no walk from its entry point reaches at level 0."""
    return int((~Level0(hnsw_graph(index)).reached()).sum())


def _graph(factory: str, metric: str, vectors: np.ndarray):
    faiss = load_faiss()
    index = faiss.index_factory(DIM, factory, faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT)
    index.add(vectors)
    return index


@pytest.mark.parametrize(("factory", "metric", "layout"), [("HNSW4", "l2", "20 copies"), ("HNSW8", "ip", "40 copies"),
                                                           ("HNSW8", "l2", "mixed"), ("HNSW4", "ip", "mixed"),
                                                           ("HNSW8", "l2", "only copies"),
                                                           ("HNSW8", "l2", "all the same")])
def test_every_copy_is_found(tmp_path, factory, metric, layout):
    """What petal index writes: a search for a vector with k its number of copies (two or more) returns every
    copy."""
    sizes = LAYOUTS[layout]
    points, vectors = _copies(sizes)
    pq.write_table(pa.table({"id": np.arange(len(vectors)),
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}),
                   tmp_path / "copies.parquet")
    out = tmp_path / "out"
    petal.index(tmp_path / "copies.parquet", out, vectors_column="emb", index_factory=factory, metric=metric,
                quiet=True)
    first = np.r_[0, np.cumsum(sizes)]
    missed = {}
    with petal.open_index(out) as opened:
        for size in sorted(set(sizes) - {1}):
            groups = [g for g, s in enumerate(sizes) if s == size]
            for g, hits in zip(groups, opened.search_stored(points[groups], k=size)):
                lost = set(range(first[g], first[g + 1])) - {int(h.id) for h in hits}
                if lost:
                    missed[g] = len(lost)
    assert not missed, f"copies not returned, by group: {missed}"
    index = load_faiss().read_index(str(next((out / "versions").glob("*/index.faiss"))))
    assert unreached_nodes(index) == 0


@pytest.mark.parametrize(("factory", "metric", "layout"), [("HNSW4", "l2", "20 copies"), ("HNSW8", "ip", "40 copies"),
                                                           ("HNSW8", "l2", "mixed"), ("HNSW16", "l2", "all the same")])
@pytest.mark.parametrize("copies_linked", [True, False])
def test_the_reached_set_never_shrinks(monkeypatch, factory, metric, layout, copies_linked):
    """Each splice (and each group of copies linked) keeps every node a walk reached and reaches the spliced node;
    with the copies left as FAISS linked them, the splices alone reach every node."""
    index = _graph(factory, metric, _copies(LAYOUTS[layout])[1])
    level0 = Level0(hnsw_graph(index))
    assert (~level0.reached()).sum() > 0, "the case needs nodes no walk reaches to begin with"
    splice, relink = graph_repair._splice, graph_repair._relink
    calls = {"splice": 0, "relink": 0}

    def checked_splice(level0, host, node, seen, spliced):
        before = level0.reached()
        splice(level0, host, node, seen, spliced)
        after = level0.reached()
        assert not (before & ~after).any(), "a splice cut a reached node off"
        assert after[node] and after.sum() > before.sum()
        calls["splice"] += 1

    def checked_relink(level0, group, nearest):
        before = level0.reached()
        changed = relink(level0, group, nearest)
        assert not (before & ~level0.reached()).any(), "linking copies cut a reached node off"
        calls["relink"] += changed
        return changed

    monkeypatch.setattr(graph_repair, "_splice", checked_splice)
    monkeypatch.setattr(graph_repair, "_relink", checked_relink)
    if not copies_linked:
        monkeypatch.setattr(graph_repair, "link_copies", lambda graph_index: 0)
    made = link_unreachable(index)
    assert made == calls["splice"]
    assert calls["relink"] > 0 if copies_linked else calls["relink"] == 0
    assert unreached_nodes(index) == 0
    assert link_unreachable(index) == 0  # nothing left to do


def test_copies_under_quantized_and_binary_graphs():
    """Copies are the same code, whatever the codes: an SQ8 graph and a binary one are linked too."""
    faiss = load_faiss()
    _, vectors = _copies([30] * 40)
    index = faiss.index_factory(DIM, "HNSW8,SQ8", faiss.METRIC_L2)
    index.train(vectors)
    index.add(vectors)
    assert unreached_nodes(index) > 0
    link_unreachable(index)
    assert unreached_nodes(index) == 0
    codes = np.repeat(np.random.default_rng(2).integers(0, 256, (40, 8), dtype=np.uint8), 30, axis=0)
    binary = faiss.IndexBinaryHNSW(64, 4)
    binary.add(codes)
    assert unreached_nodes(binary) > 0
    link_unreachable(binary)
    assert unreached_nodes(binary) == 0


def _petal(*argv: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, timeout=300, stdin=subprocess.DEVNULL)


def test_verify_refuses_a_graph_with_unreached_nodes(tmp_path):
    """A version whose graph leaves nodes unreached (as petal wrote it before, cut here with FAISS, every checksum
    signed again) passed petal verify while no query could return those documents: now 65 naming index.faiss, and
    petal rebuild writes a version that passes."""
    faiss = load_faiss()
    vectors = np.random.default_rng(0).standard_normal((2000, DIM)).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(len(vectors)),
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}),
                   tmp_path / "v.parquet")
    out = tmp_path / "out"
    built = _petal("index", tmp_path / "v.parquet", "--out", out, "--vectors-column", "emb", "--index-factory",
                   "HNSW8", "--metric", "l2", "-q")
    assert built.returncode == 0, built.stderr[-3000:]
    assert _petal("verify", out).returncode == 0
    version = out / "versions" / (out / "CURRENT").read_text().strip()
    index = faiss.read_index(str(version / "index.faiss"))
    level0 = Level0(hnsw_graph(index))
    cut = np.setdiff1d(np.arange(100, 130), [level0.entry])
    holders = np.searchsorted(level0.offsets, np.arange(len(level0.links)), side="right") - 1
    at = np.flatnonzero(np.isin(level0.links, cut))
    level0.links[at] = holders[at]  # NOTE: a link to itself: a walk goes nowhere by it
    assert unreached_nodes(index) >= len(cut)
    faiss.write_index(index, str(version / "index.faiss"))
    resign(version, sha256=True)

    checked = _petal("verify", out)
    assert checked.returncode == 65, checked.stdout + checked.stderr
    assert "index.faiss" in checked.stdout and "reached by no search" in checked.stdout
    assert "petal rebuild" in checked.stdout
    rebuilt = _petal("rebuild", out)
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert _petal("verify", out).returncode == 0, "the rebuilt version links every vector"

