"""Quantized indexes (``--quantize int8``, ``--quantize binary``) queried by vectors: ``petal query --vector-file``
and ``Index.search_stored`` take the index's own codes, as ``petal embed --quantize`` writes them, and refuse (65,
naming the file; ``UsageError`` in Python) what cannot be such a query.

Real Parquet, the packaged model, real FAISS, every command in its own process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import petal
from petal.cli.common import float32_value
from petal.pipeline.reliability.errors import UsageError
from tests.conftest import REPO, SAMPLE_DATA
from tests.test_open_audit_tamper import refused

PETAL = [sys.executable, "-m", "petal.cli.main"]
QUERIES = ["how do plants grow", "rocket engines and space travel", "the history of jazz music"]


def petal_run(*argv: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PETAL, *map(str, argv)], capture_output=True, text=True, cwd=REPO, timeout=300,
                          stdin=subprocess.DEVNULL)


def hits(proc: subprocess.CompletedProcess[str]) -> list[list[tuple[str, float]]]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [[(hit["id"], hit["score"]) for hit in json.loads(line)["hits"]] for line in proc.stdout.splitlines()]


@pytest.fixture(scope="module")
def built(tmp_path_factory, minilm_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quantized")
    out = {"root": root}
    # the indexes, and the queries as float vectors, int8 codes (the int8 index's ranges) and packed sign bits
    indexes = {name: ["index", SAMPLE_DATA / "shard-000.parquet", "--out", root / name, "--quantize", name, "-q"]
               for name in ("int8", "binary")}
    embeds = {name: ["embed", *QUERIES, "--query", "--output", root / f"{name}.npy", *extra]
              for name, extra in {"float": [], "codes": ["--quantize", "int8", "--calibration", root / "int8"],
                                  "bits": ["--quantize", "binary"]}.items()}
    # NOTE: the runs that need nothing of each other run side by side (each loads MiniLM, mostly on one core); the
    # int8 codes need the int8 index's calibration, so that embed runs after them
    first = {**indexes, "float": embeds["float"], "bits": embeds["bits"]}
    for name, proc in petal_side_by_side(first).items():
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
    proc = petal_run(*embeds["codes"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out.update({name: root / name for name in indexes})
    out.update({name: root / f"{name}.npy" for name in embeds})
    return out


def petal_side_by_side(runs: dict[str, list[object]]) -> dict[str, subprocess.CompletedProcess[str]]:
    """``petal_run`` of every argv in ``runs``, all at once."""
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = {name: pool.submit(petal_run, *argv) for name, argv in runs.items()}
        return {name: future.result() for name, future in futures.items()}


def test_int8_codes_search_an_int8_index_as_their_float_vectors(built):
    """Before: the codes (calibrated: ``floor(255 (x - low) / span) - 128`` per dimension) were searched as if they
    were the float values, an offset and scale per dimension that reorders the hits, silently."""
    by_float = hits(petal_run("query", built["int8"], "--vector-file", built["float"], "-k", "5", "--json"))
    by_codes = hits(petal_run("query", built["int8"], "--vector-file", built["codes"], "-k", "5", "--json"))
    assert np.load(built["codes"]).dtype == np.int8
    for floats, codes in zip(by_float, by_codes):
        assert [i for i, _ in codes[:3]] == [i for i, _ in floats[:3]]
        assert np.allclose([s for _, s in codes], [s for _, s in floats], atol=0.02)
    with petal.open_index(built["int8"]) as index:
        api = index.search_stored(np.load(built["codes"]), 5)
    assert [[hit.id for hit in q] for q in api] == [[i for i, _ in q] for q in by_codes]


@pytest.mark.parametrize("rescore", ["0", "10"])
def test_packed_sign_bits_search_a_binary_index(built, rescore):
    """``petal embed --quantize binary`` writes ``[n, dim / 8]`` uint8: before, 65 "vectors of dim 48, the index
    holds dim 384". They are the float query's sign bits: Hamming-only search answers as the float query does."""
    bits = hits(petal_run("query", built["binary"], "--vector-file", built["bits"], "-k", "5", "--json",
                          "--rescore", rescore))
    assert len(bits) == len(QUERIES) and all(len(q) == 5 for q in bits)
    if rescore == "0":
        by_float = hits(petal_run("query", built["binary"], "--vector-file", built["float"], "-k", "5", "--json",
                                  "--rescore", "0"))
        assert [[s for _, s in q] for q in bits] == [[s for _, s in q] for q in by_float]
    packed = np.load(built["bits"])
    with petal.open_index(built["binary"], rescore=int(rescore)) as index:
        from_packed = index.search_stored(packed, 5)
        from_bools = index.search_stored(np.unpackbits(packed, axis=1).astype(bool), 5)
    assert [[hit.id for hit in q] for q in from_packed] == [[hit.id for hit in q] for q in from_bools]
    assert [[(hit.id, float32_value(hit.score)) for hit in q] for q in from_packed] == bits


@pytest.mark.parametrize(("name", "rows", "words"), [
    ("binary", lambda: np.ones((2, 384), np.uint8), ["unsigned integers have no sign"]),
    ("binary", lambda: np.ones((2, 384), np.uint16), ["unsigned integers have no sign"]),
    ("binary", lambda: np.ones((2, 47), np.uint8), ["uint8 [num_queries, 48]"]),
    ("binary", lambda: np.ones((2, 48), np.int8), ["[num_queries, 384]"]),
    ("int8", lambda: np.ones((2, 48), np.uint8), ["int8 [num_queries, 384]"]),
    ("int8", lambda: np.ones((2, 384), bool), ["type bool"]),
])
def test_what_no_such_index_takes_is_65_naming_the_file(built, tmp_path, name, rows, words):
    np.save(tmp_path / "q.npy", rows())
    refused(petal_run("query", built[name], "--vector-file", tmp_path / "q.npy"), 65, "--vector-file", "q.npy",
            *words)
    with petal.open_index(built[name]) as index, pytest.raises(UsageError, match=words[0].replace("[", r"\[")):
        index.search_stored(rows(), 3)
