"""The dimension of a --vectors-column run is every shard's, not the first vector's: shards of different dimensions
are 65 naming one of each (list, large_list and fixed_size_list alike; before, a list shard of another dimension was
indexed with every row a wrong_dim skip, exit 0), and a stray length or an empty vector in a shard's first rows is a
wrong_dim row, not the dimension (before, one short first vector made every other row wrong_dim, and an empty first
vector was 66 'holds no vector in any shard'). Real Parquet, real FAISS, real petal processes (CliRunner)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli

TYPES = {"list": lambda dim: pa.list_(pa.float32()), "large_list": lambda dim: pa.large_list(pa.float64()),
         "fixed_size_list": lambda dim: pa.list_(pa.float16(), dim)}


def write(path: Path, dim: int, kind: str = "list", rows: list | None = None, n: int = 6) -> None:
    if rows is None:
        rows = [list(map(float, v)) for v in np.random.default_rng(dim).standard_normal((n, dim))]
    pq.write_table(pa.table({"id": [f"{path.stem}-{i}" for i in range(len(rows))],
                             "emb": pa.array(rows, TYPES[kind](dim))}), path)


def index(*args) -> tuple[int, str, dict]:
    result = CliRunner().invoke(cli, ["index", *map(str, args), "--vectors-column", "emb", "-q", "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stderr, json.loads(result.stdout) if result.stdout.strip() else {}


@pytest.mark.parametrize("first, second", [("list", "list"), ("large_list", "list"), ("fixed_size_list", "list"),
                                           ("list", "fixed_size_list")])
def test_shards_of_different_dimensions_are_65_naming_both(tmp_path, first, second):
    write(tmp_path / "a.parquet", 8, first)
    write(tmp_path / "b.parquet", 4, second)
    write(tmp_path / "c.parquet", 8, "list")
    out = tmp_path / "out"
    rc, stderr, _ = index(tmp_path, "--out", out)
    assert rc == 65, stderr
    said = stderr.strip().splitlines()[-1]
    assert f"8 in {tmp_path / 'a.parquet'} and 1 more shards" in said and f"4 in {tmp_path / 'b.parquet'}" in said
    assert not out.joinpath("CURRENT").exists()


def test_a_shard_of_another_dimension_than_the_live_version_is_78_saying_full(tmp_path):
    write(tmp_path / "a.parquet", 8)
    out = tmp_path / "out"
    assert index(tmp_path / "a.parquet", "--out", out)[0] == 0
    write(tmp_path / "a.parquet", 4)  # the same shard, written again with 4-d vectors
    rc, stderr, _ = index(tmp_path / "a.parquet", "--out", out)
    assert rc == 78 and "dim: 8 -> 4" in stderr and "--full" in stderr, stderr
    rc, stderr, _ = index(tmp_path / "a.parquet", "--out", out, "--full")
    assert rc == 0, stderr


@pytest.mark.parametrize("odd", [[1.0, 2.0, 3.0], []])
def test_an_odd_first_vector_is_a_wrong_dim_row_not_the_dimension(tmp_path, odd):
    good = [list(map(float, v)) for v in np.random.default_rng(0).standard_normal((5, 8))]
    write(tmp_path / "a.parquet", 8, rows=[None, odd, *good])
    rc, stderr, report = index(tmp_path / "a.parquet", "--out", tmp_path / "out")
    assert rc == 0, stderr
    assert report["model"]["dim"] == 8 and report["index"]["num_vectors"] == 5
    assert report["rows"]["skipped"] == {"null_vector": 1, "wrong_dim": 1}
    rejects = pq.read_table(report["rejects_file"]).to_pylist()
    assert rejects == [{"shard": str(tmp_path / "a.parquet"), "row": 0, "reason": "null_vector"},
                       {"shard": str(tmp_path / "a.parquet"), "row": 1, "reason": "wrong_dim"}]


def test_another_dimension_beside_kept_shards_is_78_with_a_way_out_that_works(tmp_path):
    """Live a (8-d); b (4-d) indexed additively: '--full' alone read a again (65, two dimensions), so the 78 says
    --sync, and that publishes b alone."""
    (tmp_path / "a").mkdir()
    write(tmp_path / "a" / "a.parquet", 8)
    out = tmp_path / "out"
    assert index(tmp_path / "a" / "a.parquet", "--out", out)[0] == 0
    write(tmp_path / "b.parquet", 4)
    rc, stderr, _ = index(tmp_path / "b.parquet", "--out", out)
    said = stderr.strip().splitlines()[-1]
    assert rc == 78 and f"other shards ({tmp_path / 'a' / 'a.parquet'}) hold 8" in said, said
    assert "--full --sync --max-removed 100%" in said
    rc, stderr, report = index(tmp_path / "b.parquet", "--out", out, "--full", "--sync", "--max-removed", "100%")
    assert rc == 0 and report["model"]["dim"] == 4 and report["index"]["num_vectors"] == 6, stderr
