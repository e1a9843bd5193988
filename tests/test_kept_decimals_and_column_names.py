"""Kept decimals in positional notation, and column lists in messages with each name quoted.

Before: a kept ``decimal128(38, 9)`` zero was ``"0E-9"`` and -0.0000001 ``"-1.00E-7"`` (``str()``) in ``petal query
--json``, its text output and ``petal serve``; the "it has: ..." and "(columns: ...)" lists of a missing column
joined bare names with ', ', ambiguous for names '', ' sp ' or 'a,b'. Real Parquet, ``--vectors-column`` runs, the
CLI and serve's encoder."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.serve.encoding import dumps
from tests.fake_cli import invoke

PRICES = [Decimal("0E-9"), Decimal("-1.00E-7"), Decimal("1545.600000000")]
SHOWN = ["0.000000000", "-0.000000100", "1545.600000000"]


def build(tmp_path: Path, **columns: pa.Array) -> tuple[Path, int]:
    data = tmp_path / "data"
    data.mkdir()
    n = len(next(iter(columns.values())))
    emb = pa.FixedSizeListArray.from_arrays(pa.array(np.eye(n, 8, dtype=np.float32).ravel()), 8)
    pq.write_table(pa.table({"id": list(range(n)), "emb": emb, **columns}), data / "a.parquet")
    np.save(tmp_path / "q.npy", np.eye(n, 8, dtype=np.float32))
    return data, n


def test_kept_decimals_are_positional_in_json_text_and_serve(tmp_path):
    data, _ = build(tmp_path, price=pa.array(PRICES, pa.decimal128(38, 9)),
                    prices=pa.array([[p] for p in PRICES], pa.list_(pa.decimal128(38, 9))))
    out = tmp_path / "out"
    built = invoke(["index", str(data), "--out", str(out), "-q", "--vectors-column", "emb",
                    "--keep-columns", "price,prices"])
    assert built.exit_code == 0, built.output
    query = ["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "1"]
    answer = invoke([*query, "--json"])
    assert answer.exit_code == 0, answer.output
    fields = [json.loads(line)["hits"][0]["fields"] for line in answer.stdout.splitlines()]
    assert [f["price"] for f in fields] == SHOWN and [f["prices"] for f in fields] == [[s] for s in SHOWN]
    text = invoke(query)
    assert text.exit_code == 0, text.output
    assert all(f"price={s} " in text.stdout for s in SHOWN), text.stdout
    for use_orjson in (True, False):
        assert json.loads(dumps({"fields": {"price": PRICES}}, use_orjson)) == {"fields": {"price": SHOWN}}


@pytest.mark.parametrize(("flags", "said"), [
    (["--keep-columns", "nope"], "no column 'nope' (--keep-columns); it has '', ' sp ', 'a,b', 'emb', 'id'"),
    (["--text-column", "nope"], "(columns: 'id', 'emb', '', ' sp ', 'a,b')"),
])
def test_a_missing_column_lists_the_names_quoted(tmp_path, flags, said):
    data, _ = build(tmp_path, **{"": [1], " sp ": [2], "a,b": [3]})
    if flags[0] == "--text-column":  # a text run: the text column is missing at preflight
        from tests.fake_engine import make_fake_model_dir

        flags = [*flags, "--model", str(make_fake_model_dir(tmp_path / "model"))]
    else:
        flags = [*flags, "--vectors-column", "emb"]
    built = invoke(["index", str(data), "--out", str(tmp_path / "out"), "-q", *flags])
    assert built.exit_code == 65, built.output
    assert said in built.output, built.output
