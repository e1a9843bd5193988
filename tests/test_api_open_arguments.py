"""The Python API judges what ``petal query``'s flags judge: ``open_index(nprobe=)`` past FAISS's C int
(``--nprobe``'s bound) is a ``UsageError`` when it opens; it opened, and the first search raised FAISS's RuntimeError.
A path argument holding a NUL byte (``open_index``, ``rebuild``, ``index``'s out, ``json_report`` and ``delete``, a
``model``) is a ``UsageError`` naming it; it was a bare ``ValueError('embedded null byte')`` from ``os.stat``.

Real Parquet, real FAISS (the index built by petal's CLI in its own process, tests/forkrun.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import petal
from petal.pipeline.index.bounds import MAX_NPROBE
from tests._open_audit_shared import vectors_index

ROWS, DIM = 600, 16


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vectors_index(tmp_path_factory.mktemp("api_open"), "--index-factory", "IVF8,Flat", rows=ROWS, dim=DIM,
                         seed=6)


@pytest.mark.parametrize("nprobe", [MAX_NPROBE + 1, 1 << 40])
def test_an_nprobe_past_a_c_int_is_a_usage_error_when_it_opens(built: Path, nprobe: int) -> None:
    with pytest.raises(petal.UsageError, match=f"nprobe {nprobe} > {MAX_NPROBE}"), \
            petal.open_index(built, nprobe=nprobe) as index:
        index.search_stored(np.ones((1, DIM), np.float32), k=3)


def test_the_largest_nprobe_still_searches(built: Path) -> None:
    with petal.open_index(built, nprobe=MAX_NPROBE) as index:
        hits = index.search_stored(np.ones((1, DIM), np.float32), k=3)
    assert len(hits[0]) == 3


CALLS: dict[str, Callable[[Path], Any]] = {
    "open_index path": lambda built: petal.open_index(f"{built}\0x"),
    "open_index model": lambda built: petal.open_index(built, model="/models/a\0b"),
    "rebuild out": lambda built: petal.rebuild(f"{built}\0x"),
    "index out": lambda built: petal.index(str(built), f"{built}\0x", quiet=True),
    "index delete": lambda built: petal.index(str(built), str(built), quiet=True, delete="ids\0.parquet"),
    "Embedder model": lambda built: petal.Embedder(model="a\0b"),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_a_path_holding_a_nul_byte_is_a_usage_error_naming_it(built: Path, call: str) -> None:
    with pytest.raises(petal.UsageError, match=r"\\x00.* holds a NUL byte"):
        CALLS[call](built)
