"""``ids.parquet`` written again with a column of a type (or nulls) petal never writes there, and the manifest signed
again over it (every checksum right): an integer ``text`` made ``petal query --show-text`` crash (AttributeError,
exit 1), null ids were printed as ``"id": null``, a string ``faiss_id`` or ``row`` passed; ``petal verify`` said OK
to all. Now the open (the API, ``petal query``) and ``petal verify`` refuse them: 65 naming the file and the column,
from the footer alone (types and the row groups' null counts).

Real Parquet, real FAISS; each command in its own process (tests/forkrun.py)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import forkrun
from tests._open_audit_shared import api, copy_index, resign, vectors_index

ROWS = 300


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vectors_index(tmp_path_factory.mktemp("ids_types"), "--index-factory", "Flat", "--text-column", "body",
                         rows=ROWS, dim=16, seed=5, body=[f"document {i}" for i in range(ROWS)])


REPLACED = {  # column -> the values written in its place
    "text": pa.array(range(ROWS), pa.int64()),
    "id": pa.array([None] * ROWS, pa.int64()),
    "faiss_id": pa.array([str(i) for i in range(ROWS)]),
    "row": pa.array([str(i) for i in range(ROWS)]),
    "shard": pa.array(range(ROWS), pa.int64()),
}


@pytest.mark.parametrize("column", list(REPLACED))
def test_a_column_of_another_type_or_with_nulls_is_65_at_open_and_verify(built, tmp_path, column):
    out, version = copy_index(built, tmp_path)
    path = version / "ids.parquet"
    table = pq.read_table(path)
    assert column in table.column_names, table.schema
    table = table.set_column(table.schema.get_field_index(column), column, REPLACED[column])
    pq.write_table(table, path, write_page_checksum=True)
    resign(version, sha256=True)

    opened = api(out)
    assert opened.returncode == 65, opened.stderr[-2000:]
    assert "ids.parquet" in opened.stderr and repr(column) in opened.stderr and "Traceback" not in opened.stderr
    query = forkrun.petal(["query", str(out), "--vector-file", str(built.parent / "q.npy"), "-k", "3", "--show-text"])
    assert query.rc == 65 and "ids.parquet" in query.last_line and "Traceback" not in query.stderr, query.stderr
    verified = forkrun.petal(["verify", str(out)])
    assert verified.rc == 65 and "ids.parquet" in verified.stdout + verified.stderr, verified.stdout + verified.stderr
    assert "Traceback" not in verified.stderr


def test_the_intact_index_opens_and_verifies(built):
    assert api(built).returncode == 0
    assert forkrun.petal(["verify", str(built)]).rc == 0
