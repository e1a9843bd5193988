"""A ``--keep-columns`` column whose types widen to one that cannot hold a value is refused before any work.

Before: int64 ``m = [2**53 + 1, 5]`` in one shard and float64 ``m = [0.5]`` in another passed preflight (int and
float widen), then once every shard was embedded the run failed 65 'a value does not fit the type the column is
stored as (Integer value 9007199254740993 not in range ...)', naming neither the stored type, the shard that forced
it nor the row; int64 beside uint64 2**64 - 1 the same. Now 65 before the model loads, naming the column, the shard,
the value and where (the footer's statistics, else the row read), every shard's type and the type stored; from the
shards a run keeps from the live version too. Real Parquet, the CLI with the tests' fake engine."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_cli import invoke
from tests.fake_engine import make_fake_model_dir, read_log

FAKE = "PETAL_TEST_FAKE_ENGINE"
BIG = 2**53 + 1


def shard(path: Path, first_id: int, m: pa.Array, statistics: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = len(m)
    pq.write_table(pa.table({"id": list(range(first_id, first_id + n)), "text": [f"text {i}" for i in range(n)],
                             "m": m, "emb": pa.array([[1.0, float(i)] for i in range(n)], pa.list_(pa.float32()))}),
                   path, write_statistics=statistics)
    return path


def index(tmp_path: Path, *sources: Path, vectors: bool = False):
    flags = ["--vectors-column", "emb"] if vectors else ["--model", str(make_fake_model_dir(tmp_path / "model"))]
    return invoke(["index", *map(str, sources), "--out", str(tmp_path / "out"), "-q", "--keep-columns", "m", *flags],
                  env={FAKE: str(tmp_path / "fake.log")})


def nothing_done(tmp_path: Path) -> bool:
    return not (tmp_path / "fake.log").exists() or read_log(tmp_path / "fake.log") == []


@pytest.mark.parametrize("statistics, where", [(True, "row group 0's largest, from its footer"), (False, "row 0")])
@pytest.mark.parametrize("vectors", [False, True], ids=["text", "vectors-column"])
def test_an_int64_beyond_float64_beside_a_float64_shard_is_refused_before_any_work(tmp_path, statistics, where,
                                                                                  vectors):
    a = shard(tmp_path / "src" / "a.parquet", 0, pa.array([BIG, 5], pa.int64()), statistics)
    shard(tmp_path / "src" / "b.parquet", 10, pa.array([0.5], pa.float64()), statistics)
    result = index(tmp_path, a.parent, vectors=vectors)
    assert result.exit_code == 65, result.output
    assert f"--keep-columns 'm': {a} holds {BIG} ({where}), which double cannot hold" in result.output, \
        result.output
    assert "a.parquet int64, " in result.output and "b.parquet double" in result.output
    assert nothing_done(tmp_path) and not (tmp_path / "out" / "CURRENT").exists()


def test_a_uint64_beyond_int64_beside_an_int64_shard_is_refused_before_any_work(tmp_path):
    shard(tmp_path / "src" / "a.parquet", 0, pa.array([1, 2], pa.int64()))
    b = shard(tmp_path / "src" / "b.parquet", 10, pa.array([5, 2**64 - 1], pa.uint64()), statistics=False)
    result = index(tmp_path, b.parent)
    assert result.exit_code == 65, result.output
    assert f"holds {2**64 - 1} (row 1), which int64 cannot hold" in result.output, result.output
    assert nothing_done(tmp_path)


@pytest.mark.parametrize("first, second", [("int", "float"), ("float", "int")])
def test_a_kept_shards_values_are_checked_against_a_named_shards_type(tmp_path, first, second):
    values = {"int": pa.array([BIG], pa.int64()), "float": pa.array([0.5], pa.float64())}
    a = shard(tmp_path / "src" / "a.parquet", 0, values[first])
    assert index(tmp_path, a).exit_code == 0
    current = (tmp_path / "out" / "CURRENT").read_text()
    (tmp_path / "fake.log").unlink()
    b = shard(tmp_path / "src" / "b.parquet", 10, values[second])
    result = index(tmp_path, b)  # additive: a is kept from the live version
    assert result.exit_code == 65, result.output
    assert f"holds {BIG} (" in result.output and "which double cannot hold" in result.output, result.output
    assert "a.parquet" in result.output and "b.parquet" in result.output
    assert nothing_done(tmp_path) and (tmp_path / "out" / "CURRENT").read_text() == current


def test_widened_values_that_fit_still_index(tmp_path):
    shard(tmp_path / "src" / "a.parquet", 0, pa.array([2**53, -5], pa.int64()), statistics=False)
    shard(tmp_path / "src" / "b.parquet", 10, pa.array([0.5], pa.float64()))
    result = index(tmp_path, tmp_path / "src")
    assert result.exit_code == 0, result.output
    version = (tmp_path / "out" / "CURRENT").read_text().strip()
    m = pq.read_table(tmp_path / "out" / "versions" / version / "ids.parquet", columns=["m"]).column("m")
    assert m.type == pa.float64() and sorted(m.to_pylist()) == [-5.0, 0.5, float(2**53)]


def _spy(monkeypatch) -> dict[str, list[str]]:
    """The files whose kept values were checked: from their footers (``statistics``) or read (``reading``)."""
    from petal.pipeline.store import kept_values

    seen: dict[str, list[str]] = {"statistics": [], "reading": []}
    for what, name in (("statistics", "_by_statistics"), ("reading", "_by_reading")):
        real = getattr(kept_values, name)

        def spy(source, *args, real=real, what=what):
            seen[what].append(Path(source.path).name)
            return real(source, *args)
        monkeypatch.setattr(kept_values, name, spy)
    return seen


def nested_shards(tmp_path: Path, statistics: bool, big: int = 7) -> tuple[Path, Path]:
    a = shard(tmp_path / "src" / "a.parquet", 0, pa.array([[1, big], [], None], pa.list_(pa.int64())), statistics)
    b = shard(tmp_path / "src" / "b.parquet", 10, pa.array([[0.5]], pa.list_(pa.float64())), statistics)
    return a, b


def test_a_nested_columns_values_are_checked_from_its_footers_leaves(tmp_path, monkeypatch):
    """Before: a list<int64> beside a list<double> was read whole twice on every run, a nothing-to-do rerun too."""
    seen = _spy(monkeypatch)
    a, b = nested_shards(tmp_path, statistics=True)
    assert index(tmp_path, a, b, vectors=True).exit_code == 0
    assert index(tmp_path, a, b, vectors=True).exit_code == 0  # nothing to do
    assert seen["reading"] == [] and seen["statistics"].count("a.parquet") == 2, seen
    a, b = nested_shards(tmp_path / "big", statistics=True, big=BIG)
    result = index(tmp_path / "big", a, b, vectors=True)
    assert result.exit_code == 65, result.output
    assert f"holds {BIG} (row group 0's largest m.list.element, from its footer)" in result.output, result.output


def test_a_shard_is_read_once_a_run_and_a_kept_one_stored_as_the_same_type_not_again(tmp_path, monkeypatch):
    seen = _spy(monkeypatch)
    a, b = nested_shards(tmp_path, statistics=False)
    assert index(tmp_path, a, b, vectors=True).exit_code == 0
    assert seen["reading"] == ["a.parquet"], seen  # preflight; not again under the lock
    seen["reading"].clear()
    seen["statistics"].clear()
    assert index(tmp_path, b, vectors=True).exit_code == 0  # a kept: the live version stores it as list<double>
    assert seen == {"statistics": [], "reading": []}, seen


@pytest.mark.parametrize("statistics, where", [(True, "row group 0's smallest s.a, from its footer"), (False, "row 0")])
def test_a_struct_whose_fields_differ_between_shards_is_checked_by_field_name(tmp_path, statistics, where):
    """Before: struct<a: int64> beside struct<a: double, b: int8> skipped the check (their fields differed in number)
    and the merge refused it once every shard was embedded."""
    a = tmp_path / "src" / "a.parquet"
    a.parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": [0], "text": ["x"], "emb": pa.array([[1.0, 0.0]], pa.list_(pa.float32())),
                             "s": pa.array([{"a": BIG}], pa.struct([("a", pa.int64())]))}), a,
                   write_statistics=statistics)
    pq.write_table(pa.table({"id": [1], "text": ["y"], "emb": pa.array([[0.0, 1.0]], pa.list_(pa.float32())),
                             "s": pa.array([{"a": 0.5, "b": 1}], pa.struct([("a", pa.float64()), ("b", pa.int8())]))}),
                   tmp_path / "src" / "b.parquet", write_statistics=statistics)
    result = invoke(["index", str(a.parent), "--out", str(tmp_path / "out"), "-q", "--keep-columns", "s",
                     "--model", str(make_fake_model_dir(tmp_path / "model"))], env={FAKE: str(tmp_path / "fake.log")})
    assert result.exit_code == 65, result.output
    assert f"--keep-columns 's': {a} holds " in result.output, result.output
    assert f"({where}), which struct<a: double" in result.output, result.output
    assert nothing_done(tmp_path) and not (tmp_path / "out" / "CURRENT").exists()


@pytest.mark.parametrize("statistics, where", [(True, "row group 0's largest, from its footer"), (False, "row 1")])
def test_a_decimal_a_float_cannot_print_back_beside_a_float64_shard_is_refused_before_any_work(tmp_path, statistics,
                                                                                               where):
    """Before: decimal128(20, 2) 123456789012345678.91 beside a float64 shard was stored as 1.2345678901234568e+17
    at exit 0 (Arrow's cast of a decimal to a float rounds, never raises)."""
    from decimal import Decimal

    big = Decimal("123456789012345678.91")
    a = shard(tmp_path / "src" / "a.parquet", 0, pa.array([Decimal("0.10"), big], pa.decimal128(20, 2)), statistics)
    shard(tmp_path / "src" / "b.parquet", 10, pa.array([0.5], pa.float64()), statistics)
    result = index(tmp_path, a.parent, vectors=True)
    assert result.exit_code == 65, result.output
    assert f"--keep-columns 'm': {a} holds {big!r} ({where}), which double cannot hold" in result.output, result.output
    assert "a.parquet decimal128(20, 2), " in result.output and not (tmp_path / "out" / "CURRENT").exists()


@pytest.mark.parametrize("statistics", [True, False])
def test_decimals_a_float_prints_back_still_index(tmp_path, statistics):
    from decimal import Decimal

    values = [Decimal("0.10"), Decimal("-1234567890123.45")]
    shard(tmp_path / "src" / "a.parquet", 0, pa.array(values[:2], pa.decimal128(20, 2)), statistics)
    shard(tmp_path / "src" / "c.parquet", 5, pa.array([Decimal("0.5")], pa.decimal128(5, 1)), statistics)
    shard(tmp_path / "src" / "b.parquet", 10, pa.array([0.5], pa.float64()), statistics)
    result = index(tmp_path, tmp_path / "src", vectors=True)
    assert result.exit_code == 0, result.output
    version = (tmp_path / "out" / "CURRENT").read_text().strip()
    m = pq.read_table(tmp_path / "out" / "versions" / version / "ids.parquet", columns=["m"]).column("m")
    assert sorted(m.to_pylist()) == [-1234567890123.45, 0.1, 0.5, 0.5]


@pytest.mark.parametrize("statistics", [True, False])
@pytest.mark.parametrize("decimal_type, texts, float_type", [
    (pa.decimal128(20, 2), ["1545.60", "2.00", "-0.07"], pa.float64()),
    (pa.decimal128(38, 18), ["1.00", "0.03", "9.99"], pa.float64()),  # Spark's default decimal
    (pa.decimal128(7, 2), ["0.10", "2.50", "12345.6"], pa.float32()),
], ids=["float64", "spark", "float32"])
def test_short_decimals_beside_a_float_shard_index_as_the_float_nearest_them(tmp_path, statistics, decimal_type,
                                                                             texts, float_type):
    """Before: 1545.60 as decimal128(20, 2) beside a float64 shard was refused 65 'which double cannot hold' (Arrow's
    cast of a decimal to a float is not correctly rounded: 1545.6000000000001, which does not print back as it), and
    before that check it was stored so; 0.10 as float32 the same. Each is stored as the float nearest it."""
    from decimal import Decimal

    import numpy as np

    values = [Decimal(t) for t in texts]
    shard(tmp_path / "src" / "a.parquet", 0, pa.array(values, decimal_type), statistics)
    shard(tmp_path / "src" / "b.parquet", 10, pa.array([0.5], float_type), statistics)
    result = index(tmp_path, tmp_path / "src", vectors=True)
    assert result.exit_code == 0, result.output
    version = (tmp_path / "out" / "CURRENT").read_text().strip()
    stored = pq.read_table(tmp_path / "out" / "versions" / version / "ids.parquet").sort_by("id").column("m")
    assert stored.type == float_type
    nearest = np.array([float(v) for v in values] + [0.5], float_type.to_pandas_dtype())
    assert stored.to_pylist() == [float(x) for x in nearest]


def test_short_decimals_of_a_kept_shard_and_in_lists_are_stored_as_the_float_nearest_them(tmp_path):
    """A shard kept from the live version (its side file holds decimals) and a list<decimal> beside a list<double>:
    the same, through the version's columns file (``cast_kept``)."""
    from decimal import Decimal

    a = tmp_path / "src" / "a.parquet"
    shard(a, 0, pa.array([Decimal("1545.60"), Decimal("0.03")], pa.decimal128(38, 18)))
    assert index(tmp_path, tmp_path / "src", vectors=True).exit_code == 0
    shard(tmp_path / "src" / "b.parquet", 10, pa.array([0.5], pa.float64()))
    result = index(tmp_path, tmp_path / "src", vectors=True)
    assert result.exit_code == 0, result.output
    version = (tmp_path / "out" / "CURRENT").read_text().strip()
    stored = pq.read_table(tmp_path / "out" / "versions" / version / "ids.parquet").sort_by("id").column("m")
    assert stored.to_pylist() == [1545.6, 0.03, 0.5]

    lists = tmp_path / "lists"
    shard(lists / "a.parquet", 0, pa.array([[Decimal("0.10"), Decimal("1545.60")]], pa.list_(pa.decimal128(20, 2))))
    shard(lists / "b.parquet", 10, pa.array([[0.5]], pa.list_(pa.float64())))
    result = invoke(["index", str(lists), "--out", str(tmp_path / "out_lists"), "-q", "--keep-columns", "m",
                     "--vectors-column", "emb"], env={FAKE: str(tmp_path / "fake.log")})
    assert result.exit_code == 0, result.output
    version = (tmp_path / "out_lists" / "CURRENT").read_text().strip()
    stored = pq.read_table(tmp_path / "out_lists" / "versions" / version / "ids.parquet").sort_by("id").column("m")
    assert stored.to_pylist() == [[0.1, 1545.6], [0.5]]
