"""The usage errors of ``petal query`` that the index's manifest alone decides import neither FAISS, Arrow nor torch
(the README: usage errors import neither torch nor FAISS): a text query on an index of precomputed vectors, a
``--where`` on a column the index does not keep, a ``--where`` on a binary index. They were judged after the index
opened (FAISS and pyarrow loaded); the message and exit code are the same (2).

A fresh interpreter per command (tests/test_lazy_imports.py's ``run``), over indexes petal built (real Parquet,
real FAISS)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests import forkrun
from tests._open_audit_shared import index_vectors, vectors_shard
from tests.test_lazy_imports import run

ROWS, DIM = 300, 16


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lazy_manifest")
    data = root / "v.parquet"
    flat = vectors_shard(data, rows=ROWS, dim=DIM, seed=9, lang=[("en", "de")[i % 2] for i in range(ROWS)])
    np.save(root / "q.npy", flat[:1])
    return {name: index_vectors(data, root / name, "--index-factory", factory, "--keep-columns", "lang")
            for name, factory in (("flat", "Flat"), ("binary", "BFlat"))}


CASES = {
    "text query, precomputed vectors": ("flat", ["glaciers"]),
    "where on a column not kept": ("flat", ["--vector-file", "Q", "--where", "topic = 'x'"]),
    "where on a binary index": ("binary", ["--vector-file", "Q", "--where", "lang = 'en'"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_usage_error_the_manifest_decides_loads_nothing_heavy(indexes: dict[str, Path], tmp_path: Path,
                                                                case: str) -> None:
    name, args = CASES[case]
    argv = ["query", str(indexes[name]), *[str(indexes[name].parent / "q.npy") if a == "Q" else a for a in args]]
    code, loaded = run(argv, tmp_path)
    assert code == 2
    assert not loaded, f"petal {' '.join(argv)} imported {sorted(loaded)}"


def test_the_same_messages_as_when_the_index_opened(indexes: dict[str, Path]) -> None:
    q = str(indexes["flat"].parent / "q.npy")
    text = forkrun.petal(["query", str(indexes["flat"]), "glaciers"])
    assert text.rc == 2 and "was built from precomputed vectors (--vectors-column): query it by vectors" in \
        text.last_line, text.stderr
    column = forkrun.petal(["query", str(indexes["flat"]), "--vector-file", q, "--where", "topic = 'x'"])
    assert column.rc == 2 and "--where: unknown column 'topic'; filterable columns (petal index --keep-columns): " \
        "lang" in column.last_line, column.stderr
    binary = forkrun.petal(["query", str(indexes["binary"]), "--vector-file", q, "--where", "lang = 'en'"])
    assert binary.rc == 2 and "binary indexes cannot filter yet" in binary.last_line, binary.stderr
    assert "a binary --index-factory" in binary.last_line, binary.last_line  # BFlat was given, not --quantize binary
    kept = forkrun.petal(["query", str(indexes["flat"]), "--vector-file", q, "--where", "lang = 'en'", "-k", "2"])
    assert kept.rc == 0 and kept.stdout.count("lang=en") == 2, kept.stderr
