"""--vectors-column shards hold ids and vectors of the types a text run takes: a uint64 id above 2^63-1 (which the
store's int64 ids cannot hold) is refused at preflight (65 naming the file, column, value and row), as for a text
run; before, a --vectors-column run died on it with a traceback (exit 1, OverflowError) once the shard was read.
A vectors column of Arrow type null (pandas writes a column whose values are all None so) is null vectors, each row
skipped and counted (null_vector); before, it failed the whole run at preflight (65 'has type null')."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests.invariants import live


def index(*args: object) -> tuple[int, str, dict]:
    result = CliRunner().invoke(cli, ["index", *map(str, args), "-q", "--json"])
    assert result.exit_code != 1, result.output  # never a traceback
    return result.exit_code, result.stderr, json.loads(result.stdout)


@pytest.mark.parametrize("statistics", [True, False])
@pytest.mark.parametrize("dictionary", [False, True])
def test_a_uint64_id_above_int64_is_refused_naming_it(tmp_path: Path, statistics: bool, dictionary: bool):
    ids = pa.array([1, 2, 2**63 + 5], pa.uint64())
    shard = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": ids.dictionary_encode() if dictionary else ids,
                             "emb": [[0.1, 0.2, 0.3, 0.4], [0.5, 0.1, 0.2, 0.3], [0.3, 0.3, 0.1, 0.2]]}),
                   shard, write_statistics=statistics)
    rc, stderr, _ = index(shard, "--out", tmp_path / "out", "--vectors-column", "emb")
    assert rc == 65, stderr
    assert f"{shard}: id column 'id' (uint64) holds 9223372036854775813 at row 2" in stderr
    ok = tmp_path / "b.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2**63 - 1], pa.uint64()), "emb": [[0.1, 0.2], [0.2, 0.1]]}), ok)
    rc, stderr, _ = index(ok, "--out", tmp_path / "out", "--vectors-column", "emb")
    assert rc == 0, stderr
    assert sorted(live(tmp_path / "out")[0]) == [1, 2**63 - 1]


def test_a_null_typed_vectors_column_is_null_vectors_counted(tmp_path: Path):
    empty, good = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"id": [1, 2], "emb": pa.array([None, None], pa.null())}), empty)
    pq.write_table(pa.table({"id": [3, 4], "emb": [[0.1, 0.2, 0.3], [0.3, 0.2, 0.1]]}), good)
    rc, stderr, report = index(empty, good, "--out", tmp_path / "out", "--vectors-column", "emb")
    assert rc == 0, stderr
    assert report["rows"]["skipped"] == {"null_vector": 2} and report["rows"]["embedded"] == 2
    assert sorted(live(tmp_path / "out")[0]) == [3, 4]
    rc, stderr, _ = index(empty, "--out", tmp_path / "alone", "--vectors-column", "emb")
    assert rc == 66 and "holds no vector in any shard" in stderr  # as a list column of nulls only
