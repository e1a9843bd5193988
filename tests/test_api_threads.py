"""One ``petal.Embedder`` or ``petal.Index`` shared by threads (a web app's worker pool): the callers take turns
on the engine, so every thread gets exactly the rows it would get alone, and an index loads its model once."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import petal
from tests.tiny_models import TEXTS, WORDS, make_model

THREADS = 4


def text_lists(count: int, seed: int = 0) -> list[list[str]]:
    """``count`` distinct lists of 1-5 texts of 2-60 words (so their batches differ in bucket and length)."""
    rnd = random.Random(seed)
    return [[" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(2, 60))) for _ in range(rnd.randint(1, 5))]
            for _ in range(count)]


class StepWatch:
    """Wraps an engine's ``step``: counts the callers inside it at once and holds each one a moment, so that
    callers that do not take turns overlap."""

    def __init__(self, engine: object, hold_s: float = 0.01) -> None:
        self.step = engine.step  # type: ignore[attr-defined]
        self.hold_s = hold_s
        self.inside = 0
        self.most_inside = 0
        self.lock = threading.Lock()

    def __call__(self, batch: object) -> object:
        with self.lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            time.sleep(self.hold_s)
            return self.step(batch)
        finally:
            with self.lock:
                self.inside -= 1


def shared_rows(embedder: petal.Embedder, lists: list[list[str]]) -> list[np.ndarray]:
    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(embedder.encode, lists))


def test_threads_sharing_an_embedder_take_turns_and_get_their_own_rows(minilm_dir: Path):
    embedder = petal.Embedder(minilm_dir)  # the packaged MiniLM
    lists = text_lists(12)
    alone = [embedder.encode(texts) for texts in lists]
    watch = StepWatch(embedder.engine)
    embedder.engine.step = watch  # type: ignore[method-assign]
    together = shared_rows(embedder, lists)
    assert watch.most_inside == 1, "two threads stepped one engine at once"
    for texts, mine, theirs in zip(lists, alone, together):
        assert theirs.shape == (len(texts), embedder.dim)
        np.testing.assert_allclose(theirs, mine, rtol=0, atol=1e-5)


def test_threads_searching_one_index_load_its_model_once(minilm_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    from petal.pipeline.jobs import query

    source = tmp_path / "docs.parquet"
    texts = list(dict.fromkeys(" ".join(texts) for texts in text_lists(60, seed=1)))
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), source)
    petal.index(str(source), str(tmp_path / "out"), model=str(minilm_dir), quiet=True)
    index = petal.open_index(tmp_path / "out")
    made: list[object] = []
    real = query.QueryService.__init__

    def counted(self: object, *args: object, **kwargs: object) -> None:
        made.append(self)
        time.sleep(0.2)  # a model load takes a while: the other threads arrive meanwhile
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(query.QueryService, "__init__", counted)
    queries = texts[:THREADS]
    with ThreadPoolExecutor(THREADS) as pool:
        answers = list(pool.map(lambda q: index.search(q, k=3)[0], queries))
    assert len(made) == 1, f"the model loaded {len(made)} times"
    for q, hits in zip(queries, answers):
        assert hits[0].id == texts.index(q)  # each thread got its own query's answer (the document itself first)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_threads_sharing_an_embedder_on_cuda_get_their_own_rows(tmp_path: Path):
    """CUDA graphs replay from one set of input buffers: without turns, a thread's step reads another's tokens."""
    make_model("bert", tmp_path / "bert")
    embedder = petal.Embedder(tmp_path / "bert", device="cuda")
    lists = text_lists(64, seed=2) + [[t] for t in TEXTS]
    alone = [embedder.encode(texts) for texts in lists]
    for _ in range(3):
        together = shared_rows(embedder, lists)
        for mine, theirs in zip(alone, together):
            np.testing.assert_allclose(theirs, mine, rtol=0, atol=2e-3)
