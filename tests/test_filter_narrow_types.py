"""``--where`` on kept columns of a type Arrow has no ``is_in`` kernel for: a decimal32 or decimal64 column (a
Parquet ``DECIMAL(5, 2)`` as pyarrow writes it, or two such shards widened to decimal64) was a traceback
(``ArrowNotImplementedError: Function 'is_in' has no kernel matching input types (decimal32(5, 2))``, exit 1;
``petal serve``: 500; the API raised Arrow's error). Now each is compared as a type that holds its values exactly
(``filters.compared_type``) and a hit's field stays the stored value. Real Parquet, ``petal index --vectors-column``
(no model), FAISS, the CLI, the Python API and a real ``petal serve``; every type ``column_kind`` takes, plain and
as a dictionary, through ``filter_mask``."""

from __future__ import annotations

import datetime
import json
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.index.filter_values import column_kind
from petal.pipeline.index.filters import filter_mask, parse_filter
from petal.pipeline.index.search import IndexReader

ROWS = 12
DIM = 4
PRICES = [Decimal(f"{i % 3}.50") for i in range(ROWS)]  # 0.50, 1.50, 2.50, ...


def vectors(rows: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, DIM)).astype(np.float32)


def write_shard(path: Path, start: int, rows: int, columns: dict[str, pa.Array]) -> None:
    pq.write_table(pa.table({"id": np.arange(start, start + rows),
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors(rows, start).ravel()), DIM),
                             **columns}), path)


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One shard kept as decimal32, decimal64, float16 and string_view columns."""
    root = tmp_path_factory.mktemp("filter-narrow")
    write_shard(root / "docs.parquet", 0, ROWS, {
        "p32": pa.array(PRICES, pa.decimal32(5, 2)), "p64": pa.array(PRICES, pa.decimal64(12, 2)),
        "half": pa.array([i % 3 + 0.5 for i in range(ROWS)], pa.float16()),
        "name": pa.array([f"n{i % 3}" for i in range(ROWS)], pa.string_view())})
    out = root / "idx"
    result = CliRunner().invoke(cli, ["index", str(root / "docs.parquet"), "--out", str(out), "-q",
                                      "--vectors-column", "emb", "--keep-columns", "p32,p64,half,name",
                                      "--index-factory", "Flat"])
    assert result.exit_code == 0, result.output
    np.save(root / "q.npy", vectors(1, 99))
    return out, root / "q.npy"


def query_json(out: Path, query: Path, *flags: str) -> list[dict]:
    result = CliRunner().invoke(cli, ["query", str(out), "--vector-file", str(query), "-k", str(ROWS), "--json",
                                      *flags])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["hits"]


@pytest.mark.parametrize("where", ["p32 = 1.5", "p64 = 1.50", "p32 IN (1.5, 7)", "p64 IN (1, 1.5)", "half = 1.5",
                                   "name = 'n1'", "p32 = 1.5 AND p64 = 1.5"])
def test_a_narrow_column_filters_and_shows_its_stored_value(narrow, where):
    out, query = narrow
    every = query_json(out, query)
    hits = query_json(out, query, "--where", where)
    assert sorted(h["id"] for h in hits) == [i for i in range(ROWS) if i % 3 == 1]
    assert [{**h, "rank": i + 1} for i, h in enumerate(h for h in every if h["id"] % 3 == 1)] == hits
    assert {(h["fields"]["p32"], h["fields"]["p64"]) for h in hits} == {("1.50", "1.50")}
    reader = IndexReader(out)  # the Python API: the same hits, the stored decimals
    (found,) = reader.search(reader.index.reconstruct_n(0, 1), ROWS, where=where)
    assert {(h.fields["p32"], h.fields["p64"]) for h in found} == {(Decimal("1.50"), Decimal("1.50"))}


def test_the_text_output_shows_the_stored_decimal(narrow):
    out, query = narrow
    result = CliRunner().invoke(cli, ["query", str(out), "--vector-file", str(query), "--where", "p32 = 1.5"])
    assert result.exit_code == 0, result.output
    assert "p32=1.50" in result.stdout and "p64=1.50" in result.stdout, result.stdout


@pytest.mark.parametrize("where, said", [("p32 = 1.505", None), ("p32 = 1000", None),
                                         ("p32 = '1.5'", "'p32' is decimal32(5, 2); '1.5' is a string")])
def test_a_number_the_column_cannot_hold_matches_nothing_and_a_string_is_refused(narrow, where, said):
    out, query = narrow
    result = CliRunner().invoke(cli, ["query", str(out), "--vector-file", str(query), "--where", where])
    assert "Traceback" not in result.output
    if said is None:
        assert result.exit_code == 0 and "no hits" in result.output, result.output
    else:
        assert result.exit_code == 2 and said in result.stderr, result.output


def test_decimal32_and_decimal64_shards_widened_to_decimal64_filter(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "a.parquet", 0, ROWS, {"price": pa.array(PRICES, pa.decimal32(5, 2))})
    write_shard(data / "b.parquet", ROWS, ROWS, {"price": pa.array(PRICES, pa.decimal64(12, 2))})
    out = tmp_path / "idx"
    result = CliRunner().invoke(cli, ["index", str(data), "--out", str(out), "-q", "--vectors-column", "emb",
                                      "--keep-columns", "price", "--index-factory", "Flat"])
    assert result.exit_code == 0, result.output
    np.save(tmp_path / "q.npy", vectors(1, 99))
    hits = CliRunner().invoke(cli, ["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k",
                                    str(2 * ROWS), "--json", "--where", "price = 2.5"])
    assert hits.exit_code == 0, hits.output
    found = json.loads(hits.stdout)["hits"]
    assert sorted(h["id"] for h in found) == [i for i in range(2 * ROWS) if i % ROWS % 3 == 2]
    assert {h["fields"]["price"] for h in found} == {"2.50"}


def test_petal_serve_filters_a_decimal32_column(narrow, tmp_path):
    pytest.importorskip("httpx")
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from tests.test_serve import Server

    out, query = narrow
    server = Server(tmp_path / "server.log", out, "--api-key", "k")
    try:
        answer = server.client.post("/search", json={"vectors": np.load(query).tolist(), "k": ROWS,
                                                      "where": "p32 = 1.5"},
                                    headers={"Authorization": "Bearer k"})
    finally:
        server.stop()
    assert answer.status_code == 200, answer.text
    (result,) = answer.json()["results"]
    want = query_json(out, query, "--where", "p32 = 1.5")
    assert [(h["id"], h["fields"]) for h in result["hits"]] == [(h["id"], h["fields"]) for h in want]


UTC = datetime.timezone.utc
NOON = datetime.datetime(2024, 1, 31, 12)
# every type column_kind takes: (its type, three values of it, the literal the first one equals)
TYPED = [*[(t, [1, 2, None], "1") for t in (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(),
                                            pa.uint32(), pa.uint64())],
         *[(t, [1.5, 2.0, None], "1.5") for t in (pa.float16(), pa.float32(), pa.float64())],
         *[(t, [Decimal("1.50"), Decimal("2.00"), None], "1.5")
           for t in (pa.decimal32(5, 2), pa.decimal64(12, 2), pa.decimal128(5, 2), pa.decimal256(40, 2))],
         *[(t, ["a", "b", None], "'a'") for t in (pa.string(), pa.large_string(), pa.string_view())],
         *[(t, [b"a", b"b", None], "'a'") for t in (pa.binary(), pa.large_binary(), pa.binary_view())],
         (pa.bool_(), [True, False, None], "true"),
         *[(t, [NOON.date(), datetime.date(2024, 2, 1), None], "'2024-01-31'") for t in (pa.date32(), pa.date64())],
         *[(pa.timestamp(unit), [NOON, NOON.replace(hour=13), None], "'2024-01-31 12:00:00'")
           for unit in ("s", "ms", "us", "ns")],
         (pa.timestamp("ms", "UTC"), [NOON.replace(tzinfo=UTC), NOON.replace(hour=13, tzinfo=UTC), None],
          "'2024-01-31 12:00:00+00:00'"),
         *[(t, [NOON.time(), datetime.time(13), None], "'12:00:00'")
           for t in (pa.time32("s"), pa.time32("ms"), pa.time64("us"), pa.time64("ns"))]]


@pytest.mark.parametrize("dictionary", [False, True], ids=["plain", "dictionary"])
@pytest.mark.parametrize("dtype, values, literal", TYPED, ids=[str(t[0]) for t in TYPED])
def test_every_filterable_type_is_compared(dtype, values, literal, dictionary):
    """Each type a kept column can be filtered as has a comparison (Arrow 26 has no is_in for float16, decimal32,
    decimal64, the view layouts nor a dictionary): the rows holding the literal, no Arrow error."""
    assert column_kind(dtype) is not None
    column = pa.array(values, dtype)
    if dictionary:
        column = pa.DictionaryArray.from_arrays(pa.array([0, 1, None], pa.int32()), column[:2])
    mask = filter_mask(parse_filter(f"c = {literal} AND c IN ({literal})"), pa.table({"c": column}), ["c"])
    assert mask.tolist() == [True, False, False]
