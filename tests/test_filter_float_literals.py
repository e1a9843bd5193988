"""A ``--where`` number literal on a float column matches the float it is, never the one an unchecked cast makes of it
(README: numbers compare by value; one the column's type cannot hold matches nothing).

Before: the literal went through float64 and ``cast(safe=False)`` to the column's type, so ``f64 = 1e999`` matched
inf, ``f32 = 1e39`` inf, ``f32 = 16777217`` 16777216, ``f64 = 9007199254740993`` 2^53, ``f64 = 1e-99999`` and
``f32 = 1e-50`` 0.0; and ``x = 0.1`` matched a float32 0.1 in a float32 column but not once a float64 shard widened
the column. Now a literal matches the float of the column's type nearest it (in a float64 column the float32 nearest it
too) where that float, written to the literal's own significant digits, is the literal. Real Parquet, ``petal index
--vectors-column`` (no model), FAISS, the CLI and the Python API."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.index.search import IndexReader

DIM = 4
F32_01 = float(np.float32(0.1))
F64 = [math.inf, 1.0, 2.0**53, 1.0, -math.inf, 0.0, 0.1, F32_01]
F32 = [math.inf, 2.0**24, 1.0, 1.0, -math.inf, 0.0, 0.1, 3.4e38]


def _shard(path: Path, first: int, columns: dict[str, pa.Array]) -> None:
    n = len(next(iter(columns.values())))
    vectors = np.random.default_rng(first).standard_normal((n, DIM)).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(first, first + n), "text": [f"document {i}" for i in range(n)], **columns,
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}), path)


def _index(sources: list[Path], out: Path, keep: str) -> None:
    result = CliRunner().invoke(cli, ["index", *map(str, sources), "--out", str(out), "-q", "--vectors-column", "emb",
                                      "--keep-columns", keep, "--index-factory", "Flat"])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def floats(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("filter-floats")
    _shard(root / "s.parquet", 0, {"f64": pa.array(F64, pa.float64()), "f32": pa.array(F32, pa.float32())})
    _index([root / "s.parquet"], root / "idx", "f64,f32")
    np.save(root / "q.npy", np.ones((1, DIM), np.float32))
    return root / "idx", root / "q.npy"


def _ids(out: Path, query: Path, where: str) -> list[int]:
    result = CliRunner().invoke(cli, ["query", str(out), "--vector-file", str(query), "-k", "20", "--where", where,
                                      "--json"])
    assert result.exit_code == 0, result.output
    ids = sorted(h["id"] for h in json.loads(result.stdout)["hits"])
    reader = IndexReader(out)
    (hits,) = reader.search(np.load(query), 20, where=where)
    assert sorted(h.id for h in hits) == ids, where
    return ids


@pytest.mark.parametrize("where, ids", [
    # past the float's range, or under its smallest step: no stored value (not inf, not 0.0)
    ("f64 = 1e999", []), ("f64 = -1e999", []), ("f32 = 1e39", []), ("f32 = -1e39", []),
    ("f32 = 3.4028236e38", []), ("f64 = 1e-99999", []), ("f32 = 1e-50", []), ("f64 = 1e-330", []),
    # more digits than the float holds, which it is not: no stored value
    ("f32 = 16777217", []), ("f32 = 16777217.0", []), ("f64 = 9007199254740993", []),
    ("f64 = 1.0000000000000000001", []), ("f32 IN (16777217, 1)", [2, 3]), ("f64 IN (1e999, 1)", [1, 3]),
    # the float itself, however it is written
    ("f32 = 16777216", [1]), ("f32 = 1.6777216e7", [1]), ("f64 = 9007199254740992", [2]), ("f64 = 0", [5]),
    ("f32 = -0.0", [5]), ("f32 = 3.4e38", [7]), ("f32 = 0.1", [6]), ("f64 = 0.10000000000000001", [6]),
    ("f64 = 0.1000000000000000055511151231257827021181583404541015625", [6]),
    # a float64 column: the float64 nearest 0.1 and the float32 nearest it (a float32 value widened)
    ("f64 = 0.1", [6, 7]), ("f64 = 0.100000001490116119384765625", [7]),
])
def test_a_float_column_matches_the_float_a_literal_is(floats, where, ids):
    assert _ids(*floats, where) == ids


def test_a_float32_value_matches_the_same_literal_once_a_float64_shard_widens_its_column(tmp_path):
    (tmp_path / "src").mkdir()
    _shard(tmp_path / "src" / "a.parquet", 0, {"x": pa.array([0.1, 1.5], pa.float32())})
    _shard(tmp_path / "src" / "b.parquet", 10, {"x": pa.array([0.1, 2.5], pa.float64())})
    _shard(tmp_path / "alone.parquet", 0, {"x": pa.array([0.1, 1.5], pa.float32())})
    _index([tmp_path / "src"], tmp_path / "wide", "x")
    _index([tmp_path / "alone.parquet"], tmp_path / "narrow", "x")
    assert pq.read_schema(next((tmp_path / "wide").glob("versions/*/ids.parquet"))).field("x").type == pa.float64()
    np.save(tmp_path / "q.npy", np.ones((1, DIM), np.float32))
    q = tmp_path / "q.npy"
    assert _ids(tmp_path / "narrow", q, "x = 0.1") == [0]
    assert _ids(tmp_path / "wide", q, "x = 0.1") == [0, 10]
    assert _ids(tmp_path / "wide", q, "x IN (1.5, 2.5)") == [1, 11]
    assert _ids(tmp_path / "wide", q, "x = 0.10000000149011612") == [0]
