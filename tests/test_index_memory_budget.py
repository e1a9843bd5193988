"""--index-memory bounds the index build: the training sample fits half of it (FAISS's working copy the other half),
``--index-factory auto`` picks fewer IVF lists where 30 training vectors a list would not fit, the sample is read
into one array with no second copy, and a factory the budget cannot train is refused before any work (2).

Memory is checked by the sizes the build computes (sample rows x dim x 4 against the budget) and, for the copy, by
the bytes numpy allocates (tracemalloc), never by timing. Real FAISS, a real store and real Parquet throughout."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.config import IndexSettings
from petal.pipeline.index.plan import MIN_TRAIN_POINTS_PER_CENTROID, make_index, plan_index, vectors_to_train
from petal.pipeline.index.source import TAKE_BLOCK_ROWS, StoreVectors
from petal.pipeline.index.writer import training_size
from petal.pipeline.store.embeddings import EmbeddingStore
from tests.index_data import commit_split, random_vectors

MIB = 1 << 20


@pytest.mark.parametrize(("num_vectors", "dim", "budget", "factory"), [
    (200_000, 4096, 1024 * MIB, "auto"),  # measured: 2.41 GB of anonymous memory under --index-memory 1G
    (100_000, 1024, 256 * MIB, "auto"),
    (100_000, 1024, 64 * MIB, "auto"),  # PQ codes: their 64k floor was 256 MiB
    (1_000_000, 1024, 16 * MIB, "auto"),  # on disk
    (100_000, 1024, 64 * MIB, "IVF256,PQ64"),
    (200_000, 256, 8 * MIB, "IVF256,Flat"),
])
def test_training_sample_fits_half_the_budget(num_vectors, dim, budget, factory):
    settings = IndexSettings(factory=factory, memory_bytes=budget)
    plan = plan_index(num_vectors, dim, settings)
    needed = vectors_to_train(make_index(plan.factory, dim, settings.metric), plan.factory)[0]
    size = training_size(plan, dim, settings, needed)
    assert size * dim * 4 <= budget // 2, (plan.factory, size)
    assert size >= needed
    if factory == "auto":  # fewer lists, never a sample thinner than 30 a list
        assert MIN_TRAIN_POINTS_PER_CENTROID * plan.nlist * dim * 4 <= budget // 2, plan
        assert plan.storage == "ondisk" or plan.estimated_bytes <= budget


def test_auto_says_why_it_picked_fewer_lists():
    plan = plan_index(200_000, 4096, IndexSettings(memory_bytes=1 << 30))
    # 4 * sqrt(N) asks for 2048 lists; 30 vectors a list of 4096 dims fit half of 1G for 1024 (a 480 MiB sample)
    assert plan.factory.startswith("IVF1024,") and "1024 lists, not 2048" in plan.reason
    small = plan_index(200_000, 4096, IndexSettings(memory_bytes=256 * MIB))
    assert small.nlist == 256 and "256 lists, not 2048" in small.reason and "--index-memory 256.0M" in small.reason


def write_vectors(path: Path, vectors: np.ndarray) -> None:
    column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1])
    pq.write_table(pa.table({"id": np.arange(len(vectors)), "emb": column}), path)


def run_index(*args) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["index", *map(str, args), "-q", "--json"])
    return result.exit_code, result.stdout, result.stderr


def test_a_factory_the_budget_cannot_train_is_refused_before_any_work(tmp_path):
    write_vectors(tmp_path / "a.parquet", random_vectors(1100, 256, seed=3))
    out = tmp_path / "out"
    # IVF1024 trains on at least 1024 vectors of 256 dims, 1 MiB: over half of 1M
    rc, _, stderr = run_index(tmp_path / "a.parquet", "--out", out, "--vectors-column", "emb",
                              "--index-factory", "IVF1024,Flat", "--index-memory", "1M")
    assert rc == 2, stderr
    assert "--index-factory 'IVF1024,Flat' cannot be trained within --index-memory 1.0M" in stderr
    assert "1024 training vectors of dim 256, 1.0M" in stderr and "give --index-memory 2M or more" in stderr
    assert not (out / "CURRENT").exists()
    rc, stdout, stderr = run_index(tmp_path / "a.parquet", "--out", out, "--vectors-column", "emb",
                                   "--index-factory", "IVF1024,Flat", "--index-memory", "2M")
    assert rc == 0, stderr
    assert json.loads(stdout)["index"]["device"]["train_points"] * 256 * 4 <= MIB
    # a rebuild keeping the factory under a smaller --index-memory: that flag's usage error too, nothing built
    rebuilt = CliRunner().invoke(cli, ["rebuild", str(out), "--index-memory", "1M", "-q"])
    assert rebuilt.exit_code == 2, rebuilt.output
    assert "cannot be trained within --index-memory 1.0M" in rebuilt.stderr
    assert len(list((out / "versions").iterdir())) == 1


def test_auto_build_trains_within_the_budget(tmp_path):
    """3000 vectors of 256 dims under 1M: 64 lists would want 1920 training vectors (1.9 MiB); 16 lists train on
    512 (512 KiB, half the budget)."""
    write_vectors(tmp_path / "a.parquet", random_vectors(3000, 256, seed=4))
    rc, stdout, stderr = run_index(tmp_path / "a.parquet", "--out", tmp_path / "out", "--vectors-column", "emb",
                                   "--index-memory", "1M")
    assert rc == 0, stderr
    index = json.loads(stdout)["index"]
    assert index["factory"].startswith("IVF16,"), index["factory"]
    assert 0 < index["device"]["train_points"] * 256 * 4 <= MIB // 2


def test_take_reads_the_sample_into_one_array(tmp_path):
    """``StoreVectors.take`` (the training sample, the tuning queries) allocates its result and a block at a time:
    one fancy index of the whole selection was a second copy of the sample."""
    store = EmbeddingStore(tmp_path / "store")
    store.open()
    vectors = random_vectors(20_000, 256, seed=5)
    source = StoreVectors(commit_split(store, tmp_path / "data", vectors, num_shards=1), 256)
    picks = np.arange(0, 20_000, 2)
    tracemalloc.start()
    try:
        taken = source.take(picks)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(taken, vectors[picks])
    # the result (10 MB), one block, and the entry's row numbers (160 KB)
    assert peak <= taken.nbytes + TAKE_BLOCK_ROWS * 256 * 4 + MIB, (peak, taken.nbytes)


def test_lists_sized_first_hold_what_the_plain_add_holds(tmp_path):
    """``reserve_lists`` (one coarse-assignment pass, then each list sized to its count) changes where the codes
    live, never what they are: the same lists, ids and codes as the add without it."""
    from petal.pipeline.index.build import add_in_memory
    from petal.pipeline.index.faiss_loader import load_faiss

    faiss = load_faiss()
    store = EmbeddingStore(tmp_path / "store")
    store.open()
    vectors = random_vectors(6000, 32, seed=7)
    source = StoreVectors(commit_split(store, tmp_path / "data", vectors, num_shards=3), 32)
    built = []
    for reserve in (False, True):
        index = make_index("IVF32,SQ8", 32, "l2")
        index.train(vectors[:3000])
        add_in_memory(index, source, 1 << 20, 1024, False, reserve)
        lists = index.invlists
        built.append([(faiss.rev_swig_ptr(lists.get_ids(i), lists.list_size(i)).copy(),
                       faiss.rev_swig_ptr(lists.get_codes(i), lists.list_size(i) * lists.code_size).copy())
                      for i in range(index.nlist)])
    assert sum(len(ids) for ids, _ in built[0]) == 6000
    for (ids, codes), (ids2, codes2) in zip(*built, strict=True):
        np.testing.assert_array_equal(ids, ids2)
        np.testing.assert_array_equal(codes, codes2)
