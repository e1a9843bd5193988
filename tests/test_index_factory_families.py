"""Every family of FAISS factory string either builds, publishes and answers, or is refused before any work.

Before: ``IDMap,Flat``, ``IDMap2,PQ8`` (which the README names), ``IDMap,HNSW32`` failed at the add step (78) after
all the embedding (``add`` on an id map); ``IVF16,Flat,RFlat`` and ``Refine(...)`` over an IVF the same way
(``add_with_ids`` on a refine wrapper); a refine wrapper was searched at FAISS's ``k_factor`` 1, so it found nothing
its base index missed; HNSW under a wrapper (``IDMap,HNSW32``, ``PCA16,HNSW32``) was never given a tuned
``efSearch``; an id-mapped IVF over ``--index-memory`` was built on disk with an empty id map (no hits at all);
``HNSW32_PQ8``, ``NSG32,PQ8``, ``IVF16,ITQ,SH`` under ``--metric ip`` were published as L2 indexes that every
``petal query`` then refused as damaged (65); ``MinMax,SQ8`` (no add), ``IVF16_NSG16,Flat`` (an NSG graph of 16
nodes), ``PCA64`` of 16 dims, an ``IDMap2,PQ8`` or ``NSG`` with too few vectors failed at 78 after the work.

Real ``petal index --vectors-column`` processes (no model), real FAISS, ``petal query --vector-file``, ``petal
verify``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.config import IndexSettings
from petal.pipeline.index.plan import check_index_factory
from petal.pipeline.index.tune import search_grid
from petal.pipeline.index.writer import no_polysemous_training

PETAL = str(Path(sys.executable).parent / "petal")
DIM = 16
ROWS = 300
QUERIES = [3, 77, 150, 299]


def _write(path: Path, vectors: np.ndarray) -> None:
    path.mkdir(parents=True)
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(len(vectors))],
                             "emb": pa.array(list(vectors), pa.list_(pa.float32()))}), path / "a.parquet")


def _vectors(rows: int, dim: int = DIM) -> np.ndarray:
    vectors = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("factory-families")
    _write(root / "data", _vectors(ROWS))
    np.save(root / "q.npy", _vectors(ROWS)[QUERIES])
    return root


def petal(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([PETAL, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert "Traceback" not in done.stderr, done.stderr
    return done


def index(source: Path, out: Path, factory: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return petal("index", str(source), "--out", str(out), "--vectors-column", "emb", "-q", "--index-factory", factory,
                 *extra)


def manifest(out: Path) -> dict:
    (version,) = (out / "versions").iterdir()
    return json.loads((version / "manifest.json").read_text())


@pytest.mark.parametrize("factory, params", [
    ("IDMap,Flat", set()),
    ("IDMap2,PQ4", set()),
    ("Flat,IDMap2", set()),
    ("IDMap,HNSW16", {"efSearch"}),
    ("PCA8,HNSW16", {"efSearch"}),
    ("IVF8,Flat,RFlat", {"nprobe", "k_factor_rf"}),
    ("IDMap2,IVF8,PQ4,RFlat", {"nprobe", "k_factor_rf"}),
    ("PQ4,Refine(SQ8)", {"k_factor_rf"}),
])
def test_a_wrapped_factory_builds_tunes_through_its_wrappers_and_answers(data, tmp_path, factory, params):
    out = tmp_path / "out"
    done = index(data / "data", out, factory)
    assert done.returncode == 0, done.stderr
    record = manifest(out)["index"]
    assert set(record["search_params"]) == params, record["search_params"]
    if "k_factor_rf" in params:  # the refinement re-ranks more candidates than k: recall well above its base's
        assert record["tuning"]["reached"], record["tuning"]
    found = petal("query", str(out), "--vector-file", str(data / "q.npy"), "--json", "-k", "3")
    assert found.returncode == 0, found.stderr
    hits = [json.loads(line)["hits"] for line in found.stdout.splitlines()]
    assert [len(h) for h in hits] == [3] * len(QUERIES)
    if not factory.startswith("PCA"):  # every other family finds a corpus vector itself
        assert [h[0]["id"] for h in hits] == [f"d{i}" for i in QUERIES]
    checked = petal("verify", str(out))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("factory, metric, says", [
    ("HNSW16_PQ4", "ip", "FAISS builds this index for L2 distance whatever the metric asked (--metric ip)"),
    ("NSG16,PQ4", "ip", "FAISS builds this index for L2 distance"),
    ("IVF8,ITQ,SH", "ip", "FAISS builds this index for L2 distance"),
    ("LSH", "ip", "is an L2-only FAISS index"),
    ("MinMax,SQ8", "ip", "MinMax/MinMaxFP16 indexes only encode and decode"),
    ("ZnLattice2x8_4", "l2", "ZnLattice indexes are not supported"),
    ("IVF8_NSG16,Flat", "ip", "built from the 8 list centroids, and NSG graphs of at least 101 nodes need"),
    ("IVF8(PQ4),Flat", "l2", "built from the 8 list centroids, and 256 centroids per PQ sub-quantizer (8 bits) need"),
    ("Residual8,PQ4", "l2", "Residual... indexes (FAISS's Index2Layer) cannot be searched"),
    ("PCA32,Flat", "ip", "a PCA cannot output more dimensions (32) than it is given (16)"),
])
def test_a_factory_petal_cannot_use_is_a_usage_error_before_any_work(data, tmp_path, factory, metric, says):
    out = tmp_path / "out"
    done = index(data / "data", out, factory, "--metric", metric)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and f"--index-factory {factory!r}" in last and says in last, last
    assert not (out / "store").exists()  # nothing read or embedded


@pytest.mark.parametrize("factory, needs", [("IDMap2,PQ4", "256 centroids per PQ sub-quantizer"),
                                            ("HNSW16,Refine(PQ4)", "256 centroids per PQ sub-quantizer"),
                                            ("OPQ4,Flat", "OPQ"), ("NSG16", "NSG graphs of at least 101 nodes")])
def test_too_few_vectors_for_a_wrapped_quantizer_is_refused_before_any_work(tmp_path, factory, needs):
    _write(tmp_path / "few", _vectors(90))
    out = tmp_path / "out"
    done = index(tmp_path / "few", out, factory)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "needs at least" in last and needs in last, last
    assert not (out / "store").exists()


def test_an_opq_rotation_needs_a_vector_per_output_dimension(tmp_path):
    """FAISS's OPQ training over fewer vectors than the rotation's output dimensions (OPQ8 at d 384 on 300) aborted
    the process (exit 134 or 139: no message, no report, the lock and a staging directory left behind), for petal
    index and petal rebuild alike; 256 vectors was all petal asked for. Refused before any work (2); with enough
    vectors it builds."""
    _write(tmp_path / "few", _vectors(300, 384))
    out = tmp_path / "out"
    done = index(tmp_path / "few", out, "OPQ8,PQ8")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "needs at least 384" in last and "OPQ rotation to 384 dimensions" in last, last
    assert not (out / "store").exists()
    assert index(tmp_path / "few", out, "Flat").returncode == 0
    rebuilt = petal("rebuild", str(out), "--index-factory", "OPQ8,PQ8")
    assert rebuilt.returncode == 2 and "OPQ rotation to 384 dimensions" in rebuilt.stderr, rebuilt.stderr[-2000:]
    assert not [p.name for p in (out / "versions").iterdir() if p.name.startswith(".")]  # no staging left
    assert index(tmp_path / "few", tmp_path / "out2", "OPQ8_128,PQ8").returncode == 0  # 300 >= 256 and 128
    _write(tmp_path / "enough", _vectors(400, 384))
    assert index(tmp_path / "enough", tmp_path / "out3", "OPQ8,PQ8").returncode == 0


@pytest.mark.parametrize("factory, dim, needs", [("RQ4x8", 384, 384), ("IVF4,RQ2x8", 384, 384),
                                                 ("PRQ2x2x8", 600, 300), ("IDMap2,RQ1x4", 384, 384)])
def test_a_residual_quantizer_needs_a_vector_per_dimension_it_quantizes(tmp_path, factory, dim, needs):
    """FAISS trains a residual quantizer on a PCA of the residuals to its full dimension: over fewer vectors (RQ4x8
    at d 384 on 300, which the 256 centroids allow) the build failed after the work, 78 naming a PCA the factory
    never asked for. Refused before any work (2) with the numbers; with enough vectors it builds."""
    _write(tmp_path / "few", _vectors(needs - 1, dim))
    done = index(tmp_path / "few", tmp_path / "out", factory)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2, last
    assert f"needs at least {needs}" in last and f"{needs} dimensions a residual quantizer trains over" in last, last
    assert not (tmp_path / "out" / "store").exists()
    _write(tmp_path / "enough", _vectors(needs, dim))
    built = index(tmp_path / "enough", tmp_path / "out2", factory)
    assert built.returncode == 0, built.stderr[-2000:]


def test_an_id_mapped_ivf_over_the_memory_budget_is_built_in_memory_and_answers(tmp_path):
    vectors = _vectors(8000, 32)
    _write(tmp_path / "big", vectors)
    np.save(tmp_path / "q.npy", vectors[:2])
    out = tmp_path / "out"
    done = index(tmp_path / "big", out, "IDMap2,IVF8,Flat", "--index-memory", "1M")
    assert done.returncode == 0, done.stderr
    plan = manifest(out)["index"]["plan"]
    assert plan["storage"] == "memory" and "no id map" in plan["reason"], plan
    found = petal("query", str(out), "--vector-file", str(tmp_path / "q.npy"), "--json", "-k", "1")
    assert found.returncode == 0, found.stderr
    assert [json.loads(line)["hits"][0]["id"] for line in found.stdout.splitlines()] == ["d0", "d1"]


def test_a_pq_after_a_pca_splits_the_pca_output_not_the_input():
    check_index_factory(IndexSettings(factory="PCA16,PQ16"), "float32", 24, 1000)  # 24 % 16: FAISS builds it


@pytest.mark.parametrize("factory, names", [("IDMap,HNSW16", {"efSearch"}),
                                            ("HNSW16,RFlat", {"efSearch", "k_factor_rf"}),
                                            ("PCA8,IDMap2,HNSW16", {"efSearch"}),
                                            ("IVF8_HNSW16,PQ4,RFlat", {"nprobe", "quantizer_efSearch", "k_factor_rf"})])
def test_search_parameters_are_found_through_wrappers(factory, names):
    grid = search_grid(faiss.index_factory(DIM, factory, faiss.METRIC_INNER_PRODUCT))
    assert {name for params in grid for name in params} == names


@pytest.mark.parametrize("factory", ["HNSW16_PQ4", "NSG16,PQ4", "HNSW16,Refine(PQ4)", "IDMap,HNSW16_PQ4"])
def test_a_graph_index_pq_storage_skips_polysemous_training(factory):
    """An HNSW's or NSG's PQ storage trained polysemous codes (HNSW32_PQ8 of 2,000 x 32: 62 s, 6 s without)."""
    index = faiss.index_factory(DIM, factory, faiss.METRIC_L2)
    no_polysemous_training(index)
    stack, flags = [index], []
    while stack:
        node = faiss.downcast_index(stack.pop())
        flags.append(getattr(node, "do_polysemous_training", False))
        stack += [inner for name in ("index", "base_index", "refine_index", "storage")
                  if (inner := getattr(node, name, None)) is not None]
    assert len(flags) > 1 and not any(flags), factory


@pytest.mark.parametrize("factory", ["IVF8,Flat,RFlat", "IDMap2,IVF8,PQ4,RFlat", "HNSW16,Refine(SQ8)"])
def test_where_filters_inside_a_refine_wrapper(tmp_path, factory):
    """FAISS's refine search takes only its own parameters (the base index's inside them): ``--where`` on a refine
    wrapper was refused (2) as an index that cannot filter."""
    vectors = _vectors(ROWS)
    source = tmp_path / "data"
    source.mkdir()
    langs = ["en" if i % 2 else "fr" for i in range(ROWS)]
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(ROWS)], "lang": langs,
                             "emb": pa.array(list(vectors), pa.list_(pa.float32()))}), source / "a.parquet")
    np.save(tmp_path / "q.npy", vectors[[2, 3]])
    out = tmp_path / "out"
    done = index(source, out, factory, "--keep-columns", "lang")
    assert done.returncode == 0, done.stderr
    found = petal("query", str(out), "--vector-file", str(tmp_path / "q.npy"), "--json", "-k", "3", "--where",
                  "lang = 'en'")
    assert found.returncode == 0, found.stderr
    hits = [json.loads(line)["hits"] for line in found.stdout.splitlines()]
    assert [len(h) for h in hits] == [3, 3] and all(h["fields"]["lang"] == "en" for row in hits for h in row), hits
    assert hits[1][0]["id"] == "d3"  # an "en" query vector finds itself


@pytest.mark.parametrize("factory", ["IVF100000000,Flat", "IMI2x16,Flat"])
def test_more_lists_than_vectors_is_refused_before_faiss_allocates_them(tmp_path, factory):
    """A list count beyond the vectors is told from the factory's text: FAISS allocated the empty list table first
    (IVF100000000: 20 s and 15.7 GB before the usage error; IMI2x16, 2**32 lists: 'out of host memory', 74). Under a
    3 GB address-space limit, the usage error (2) all the same, with the count."""
    import resource

    _write(tmp_path / "few", _vectors(90))

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    done = subprocess.run([PETAL, "index", str(tmp_path / "few"), "--out", str(tmp_path / "out"), "--vectors-column",
                           "emb", "-q", "--index-factory", factory, "--metric", "l2"], capture_output=True, text=True,
                          timeout=300, preexec_fn=limited)
    last = done.stderr.strip().splitlines()[-1]
    lists = 100_000_000 if factory.startswith("IVF") else 1 << 32
    assert done.returncode == 2 and f"needs at least {lists} vectors" in last and "at most 90 vectors" in last, last
