"""``petal query --json`` writes a ``--keep-columns`` float that is NaN or infinite (in a list too) as ``null``, as
``petal serve`` answers it: ``json.dumps`` wrote ``NaN`` and ``Infinity``, which no strict JSON reader takes (jq,
JSON.parse, orjson), so one such value made the whole answer line unreadable.

Real ``petal`` processes, real Parquet and FAISS (an index of precomputed vectors: no model).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import REPO


def petal(*argv: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def strict(constant: str) -> None:
    raise ValueError(f"not JSON: {constant}")


def test_nan_and_infinite_kept_floats_are_null_in_json(tmp_path):
    emb = pa.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0], [0, 0, 0, 1.0]], pa.list_(pa.float32()))
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "emb": emb,
                             "score": pa.array([1.5, float("nan"), float("-inf"), None], pa.float32()),
                             "many": [[1.0, float("nan")], [float("inf")], [], None]}), tmp_path / "s.parquet")
    out = tmp_path / "out"
    done = petal("index", tmp_path / "s.parquet", "--out", out, "-q", "--vectors-column", "emb",
                 "--keep-columns", "score,many")
    assert done.returncode == 0, done.stderr[-3000:]
    np.save(tmp_path / "q.npy", np.ones((1, 4), np.float32))
    found = petal("query", out, "--vector-file", tmp_path / "q.npy", "--json", "-k", "4")
    assert found.returncode == 0, found.stderr[-3000:]
    hits = json.loads(found.stdout, parse_constant=strict)["hits"]
    assert {hit["id"]: hit["fields"] for hit in hits} == {
        "a": {"score": 1.5, "many": [1.0, None]}, "b": {"score": None, "many": [None]},
        "c": {"score": None, "many": []}, "d": {"score": None, "many": None}}
