"""``petal query --vector-file``: the model's flags, which set nothing there, are refused (2), never ignored.

A ``--vector-file`` query runs no model: the file's vectors are searched with FAISS on the CPU. ``--device``,
``--dtype``, ``--attention``, ``--model``, ``--query-prompt`` and ``--allow-pickle-weights`` set the query model
(where it runs, its precision, its kernel, its directory, its prompt, its weights' format), so given with
``--vector-file`` they did nothing, silently: ``--device cuda`` on a host without CUDA answered from the CPU.
Real index (the packaged MiniLM, real Parquet and FAISS), real CLI in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def petal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *args], env=ENV, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def index_and_vectors(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("query-flags")
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(12)],
                             "text": [f"document {i} about topic {i % 3}" for i in range(12)]}), root / "d.parquet")
    built = petal("index", str(root / "d.parquet"), "--out", str(root / "idx"), "--model", str(minilm_dir),
                  "--device", "cpu", "-q")
    assert built.returncode == 0, built.stderr
    vectors = root / "q.npy"
    np.save(vectors, np.random.default_rng(0).standard_normal((2, 384)).astype(np.float32))
    return root / "idx", vectors


@pytest.mark.parametrize("flags", [
    ["--device", "cuda"],
    ["--device", "cpu"],
    ["--dtype", "bfloat16"],
    ["--attention", "sdpa"],
    ["--query-prompt", "query: "],
    ["--model", "/nowhere/model"],
    ["--allow-pickle-weights"],
    ["--device", "cpu", "--dtype", "float32"],
])
def test_model_flags_with_a_vector_file_are_a_usage_error(index_and_vectors, flags):
    index, vectors = index_and_vectors
    result = petal("query", str(index), "--vector-file", str(vectors), "-k", "2", *flags)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    said = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(said) == 1 and "Traceback" not in result.stderr, result.stderr
    for flag in flags:
        if flag.startswith("--"):
            assert flag in said[0]
    assert "--vector-file" in said[0] and "runs no model" in said[0]


def test_a_vector_file_without_model_flags_and_text_queries_with_them_still_answer(index_and_vectors):
    index, vectors = index_and_vectors
    by_vectors = petal("query", str(index), "--vector-file", str(vectors), "-k", "2", "--json")
    assert by_vectors.returncode == 0, by_vectors.stderr
    assert len(by_vectors.stdout.splitlines()) == 2
    by_text = petal("query", str(index), "topic", "-k", "2", "--json", "--device", "cpu", "--dtype", "float32",
                    "--attention", "sdpa")
    assert by_text.returncode == 0, by_text.stderr
    assert len(by_text.stdout.splitlines()) == 1
