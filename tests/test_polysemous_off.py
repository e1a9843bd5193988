"""petal never trains PQ codes for polysemous search (FAISS's default for IVF-PQ and a plain ``PQ8``): annealing per
sub-quantizer that took 12 s for 2,000 vectors of 32 dims (minutes at scale) for a search mode petal never uses. The
IVF case was switched off; a top-level ``PQ``, or one under an id map, OPQ or a refine wrapper, was not. Real FAISS
indexes from ``index_factory``: every PQ inside each has the training off afterwards.
"""

from __future__ import annotations

import faiss
import pytest

from petal.pipeline.index.writer import no_polysemous_training


def pq_nodes(index) -> list:
    found, pending, seen = [], [index], set()
    while pending:
        node = faiss.downcast_index(pending.pop())
        if int(node.this) in seen:  # the IVF an IVF-PQ extracts is itself (another Python wrapper)
            continue
        seen.add(int(node.this))
        if hasattr(node, "do_polysemous_training"):
            found.append(node)
        ivf = faiss.try_extract_index_ivf(node)
        if ivf is not None:
            pending.append(ivf)
        pending += [getattr(node, name) for name in ("index", "base_index") if getattr(node, name, None) is not None]
    return found


@pytest.mark.parametrize("factory", ["PQ8", "IDMap2,PQ8", "OPQ8,PQ8", "IVF16,PQ8", "OPQ8,IVF16,PQ8",
                                     "IVF16,PQ8,RFlat", "PQ8,RFlat", "IDMap,IVF16,PQ8"])
def test_every_pq_inside_the_index_skips_polysemous_training(factory):
    index = faiss.index_factory(32, factory, faiss.METRIC_L2)
    nodes = pq_nodes(index)
    assert nodes and any(node.do_polysemous_training for node in nodes)  # FAISS's default: on
    no_polysemous_training(index)
    assert not any(node.do_polysemous_training for node in pq_nodes(index)), factory


@pytest.mark.parametrize("factory", ["IVF16,Flat", "HNSW8", "PQ8x4fs", "IVF16,SQ8", "Flat"])
def test_indexes_without_such_a_pq_are_left_as_they_are(factory):
    index = faiss.index_factory(32, factory, faiss.METRIC_L2)
    no_polysemous_training(index)  # nothing to switch off, nothing raised
    assert not pq_nodes(index) or not any(node.do_polysemous_training for node in pq_nodes(index))
