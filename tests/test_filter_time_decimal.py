"""``--where`` on the kept columns whose literals went wrong: a decimal column against a number no decimal holds
(``price = 1e999``: a raw TypeError traceback, now no row), a time-of-day column (every literal was refused: Arrow
casts no string to a time; now ``'13:45:30'`` matches), and a timestamp column with a time zone given a literal
without a UTC offset (Arrow's message of casts and ``assume_timezone``; now one that says to write the offset).
Real Parquet, ``petal index --vectors-column`` (no model), FAISS, the CLI and the Python API."""

from __future__ import annotations

import datetime
import re
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.index.search import IndexReader

ROWS = 40
DIM = 8
UTC = datetime.timezone.utc


@pytest.fixture(scope="module")
def typed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("filter-time-decimal")
    vectors = np.random.default_rng(0).standard_normal((ROWS, DIM)).astype(np.float32)
    pq.write_table(pa.table({
        "id": np.arange(ROWS), "text": [f"document {i}" for i in range(ROWS)],
        "price": pa.array([Decimal(f"{i % 4}.25") for i in range(ROWS)], pa.decimal128(10, 2)),
        "at_s": pa.array([datetime.time(12, 0, i % 4) for i in range(ROWS)], pa.time32("s")),
        "at_us": pa.array([datetime.time(7, 5, 0, 250000 * (i % 2)) for i in range(ROWS)], pa.time64("us")),
        "when": pa.array([datetime.datetime(2024, 1, 31, 12 + i % 2, tzinfo=UTC) for i in range(ROWS)],
                         pa.timestamp("ms", "UTC")),
        "stamp": pa.array([datetime.datetime(2024, 1, 31, 12, 0, 0, 500000 * (i % 2)) for i in range(ROWS)],
                          pa.timestamp("us")),
        "topic": [str(i % 3) for i in range(ROWS)], "score": pa.array([i / 4 for i in range(ROWS)], pa.float32()),
        "flag": [i % 2 == 0 for i in range(ROWS)], "year": pa.array([2000 + i % 3 for i in range(ROWS)], pa.int16()),
        "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}), root / "docs.parquet")
    out = root / "idx"
    result = CliRunner().invoke(cli, ["index", str(root / "docs.parquet"), "--out", str(out), "-q", "--vectors-column",
                                      "emb", "--keep-columns", "price,at_s,at_us,when,stamp,topic,score,flag,year",
                                      "--index-factory", "Flat"])
    assert result.exit_code == 0, result.output
    np.save(root / "q.npy", vectors[:1])
    return out, root / "q.npy"


def fields(out: Path, where: str) -> list[dict]:
    reader = IndexReader(out)
    (hits,) = reader.search(reader.index.reconstruct_n(0, 1), ROWS, where=where)
    return [h.fields for h in hits]


@pytest.mark.parametrize("where,count", [("price = 1e999", 0), ("price = -1e999", 0), ("price IN (1e400, 3.25)", 10),
                                         ("price = 3.25", 10), ("price = 3.251", 0)])
def test_a_number_no_decimal_holds_matches_no_row(typed, where, count):
    out, query = typed
    result = CliRunner().invoke(cli, ["query", str(out), "--vector-file", str(query), "-k", str(ROWS), "--where",
                                      where, "--json"])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert len(fields(out, where)) == count
    assert all(f["price"] == Decimal("3.25") for f in fields(out, where))


def test_a_time_of_day_column_takes_iso_times(typed):
    out, _ = typed
    assert {f["at_s"] for f in fields(out, "at_s = '12:00:03'")} == {datetime.time(12, 0, 3)}
    assert len(fields(out, "at_s IN ('12:00:01', '12:00:02')")) == ROWS // 2
    assert len(fields(out, "at_us = '07:05:00.25'")) == ROWS // 2
    assert len(fields(out, "at_us = '7:05'")) == ROWS // 2  # 07:05:00.000000
    assert fields(out, "at_s = '13:00'") == [] and fields(out, "at_s = '12:00:01.5'") == []


# NOTE: Parquet has no time of seconds: a time32[s] column is stored, kept and filtered as time32[ms]
@pytest.mark.parametrize("where,said", [("at_s = '12:00:01.0005'", "finer than the column's unit (ms)"),
                                        ("at_us = '07:05:00.0000001'", "finer than the column's unit (us)"),
                                        ("at_s = '24:00'", "not a time of day it can hold"),
                                        ("at_us = 'noon'", "not a time of day it can hold"),
                                        ("when = '2024-01-31 12:00:00'", "has no UTC offset"),
                                        ("when = '2024-01-31 12:00:00.0005Z'", "finer than the column's unit (ms)"),
                                        ("stamp = '2024-01-31 12:00:00.0000005'",
                                         "finer than the column's unit (us)"),
                                        ("stamp = '2024-01-31 12:00:00.0000000001'",
                                         "finer than the column's unit (us)"),
                                        ("when = '2024-01-31'", "has no UTC offset")])
def test_a_time_a_column_cannot_hold_is_a_usage_error_naming_it(typed, where, said):
    out, query = typed
    result = CliRunner().invoke(cli, ["query", str(out), "--vector-file", str(query), "--where", where])
    assert result.exit_code == 2, result.output
    column = where.split()[0]
    assert f"--where: column {column!r} is" in result.stderr and said in result.stderr, result.stderr
    assert "assume_timezone" not in result.stderr and "Traceback" not in result.output
    with pytest.raises(ValueError, match=re.escape(said)):
        fields(out, where)


def test_a_timestamp_literal_with_zeros_past_the_columns_unit_is_that_time(typed):
    """Before: Arrow's cast refused more fractional digits than the unit holds, zeros too: '12:00:00.500000' on a
    timestamp[ms] was 'not a date or time it can hold', and '12:00:00.0000005' on a timestamp[us] said so too where
    a time of day says it is finer than the column's unit."""
    out, _ = typed
    half = datetime.datetime(2024, 1, 31, 12, 0, 0, 500000)
    for where in ("stamp = '2024-01-31 12:00:00.5'", "stamp = '2024-01-31 12:00:00.500000000'",
                  "stamp = '2024-01-31T12:00:00.5000000'"):
        got = fields(out, where)
        assert len(got) == ROWS // 2 and {f["stamp"] for f in got} == {half}, where
    assert len(fields(out, "when = '2024-01-31 12:00:00.000000Z'")) == ROWS // 2
    assert len(fields(out, "when = '2024-01-31T13:00:00.000+01:00'")) == ROWS // 2


def test_a_timestamp_with_a_time_zone_takes_literals_with_their_offset(typed):
    out, _ = typed
    noon = datetime.datetime(2024, 1, 31, 12, tzinfo=UTC)
    for where in ("when = '2024-01-31 12:00:00Z'", "when = '2024-01-31T13:00:00+01:00'",
                  "when = '2024-01-31 07:00:00-0500'"):
        got = fields(out, where)
        assert len(got) == ROWS // 2 and {f["when"] for f in got} == {noon}, where


@pytest.mark.parametrize("where", ["at_s = '\udcff'", "price IN (1, '\ud800')", "\udcff = 'x'"])
def test_a_filter_holding_what_is_not_text_is_a_usage_error(typed, where):
    """A command-line byte that is not UTF-8 (read by surrogateescape) or JSON's lone "\\ud800" in a filter: a raw
    UnicodeEncodeError from Arrow (exit 1, a traceback), now exit 2 naming the character."""
    out, query = typed
    result = CliRunner().invoke(cli, ["query", str(out), "--vector-file", str(query), "--where", where])
    assert result.exit_code == 2, result.output
    at = next(i for i, char in enumerate(where) if "\ud800" <= char <= "\udfff") + 1
    assert f"character {at} is not text" in result.stderr and "Traceback" not in result.output, result.output
    with pytest.raises(ValueError, match=f"character {at} is not text"):
        fields(out, where)


WHERES = ["topic IN ('1', '2')", "score = 2.5", "flag = true", "year IN (2001, 2001.5)", "price = 3.25",
          "at_s = '12:00:01'", "when = '2024-01-31 12:00:00Z'", "topic = '1' AND score IN (0.25, 1.75)"]


def test_a_filter_does_not_import_pandas(typed):
    """pyarrow's first conversion of a Python value (a filter's literals, its matches read into numpy) asks pandas
    whether the value is pandas', importing it where installed: ~0.1-0.2 s of a one-shot ``petal query --where``.
    A filter's values are now built from buffers and its matches read from their bitmaps: making the selector of
    each filter (a fresh interpreter) imports no pandas, and each matches the rows Python's comparisons find."""
    import subprocess
    import sys

    pytest.importorskip("pandas")  # (where it is not installed there is nothing to import)
    out, _ = typed
    script = ("import sys; from petal.pipeline.index.search import IndexReader; reader = IndexReader(sys.argv[1]); "
              "[reader.selector(where) for where in sys.argv[2:]]; print('pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script, str(out), *WHERES], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", (done.stdout, done.stderr)
    reader = IndexReader(out)
    for where in WHERES:
        (hits,) = reader.search(reader.index.reconstruct_n(0, 1), ROWS, where=where)
        assert sorted(h.id for h in hits) == sorted(_brute_force(out, where)), where


def _brute_force(out: Path, where: str) -> list[int]:
    """The ids whose stored columns match ``where``, by Python comparisons (the clauses of WHERES)."""
    from petal.pipeline.index.filters import parse_filter

    table = pq.read_table(next(out.glob("versions/*/ids.parquet"))).to_pylist()
    wanted = []
    for row in table:
        ok = True
        for clause in parse_filter(where).clauses:
            value = row[clause.column]
            if isinstance(value, Decimal):
                ok &= any(value == Decimal(repr(v)) for v in clause.values)
            elif isinstance(value, datetime.time):
                ok &= any(value == datetime.time.fromisoformat(v) for v in clause.values)
            elif isinstance(value, datetime.datetime):
                ok &= any(value == datetime.datetime.fromisoformat(v.replace("Z", "+00:00")) for v in clause.values)
            else:
                ok &= value in clause.values
        if ok:
            wanted.append(row["id"])
    return wanted
