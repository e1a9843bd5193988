"""A top-level column whose name holds a dot (``body.en``) beside a struct ``body`` with a field ``en``: the column
named is the one read, by every reader of a shard's columns and of petal's own files holding kept columns.

Before: pyarrow selects columns by dotted leaf path, so ``columns=["body.en"]`` also gave the struct, and the
readers took columns by position: ``--text-column body.en`` was a TypeError traceback (exit 1), ``--id-column
meta.id`` 'unhashable dict' (1), ``--keep-columns body.en`` and ``--vectors-column e.v`` a false 'corrupt data' (65)
after embedding, ``petal embed --input --text-column body.en`` skipped every row as not_text (66); a uint64 id
column ``meta.id`` was range-checked by the struct child's statistics. Real Parquet; the CLI with the tests' fake
engine (``petal embed`` with the tiny BERT)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from tests.fake_cli import invoke
from tests.fake_engine import make_fake_model_dir

TEXTS = ["glaciers move slowly", "bread rises in the oven", "tides follow the moon"]


def dotted_shard(path: Path) -> Path:
    """Each dotted top-level column beside a struct whose field has that dotted path (the struct first: its leaf
    comes first in the file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n = len(TEXTS)
    pq.write_table(pa.table({
        "body": pa.array([{"en": f"struct text {i}"} for i in range(n)]),
        "body.en": TEXTS,
        "meta": pa.array([{"id": {"k": i}} for i in range(n)]),
        "meta.id": pa.array([100 + i for i in range(n)], pa.int64()),
        "e": pa.array([{"v": [9.0, 9.0, 9.0]} for _ in range(n)]),
        "e.v": pa.array([[1.0, float(i)] for i in range(n)], pa.list_(pa.float32())),
        "id": list(range(n)),
        "text": [f"plain {t}" for t in TEXTS],
    }), path)
    return path


def index(tmp_path: Path, *flags: str) -> tuple[int, str, IndexReader | None]:
    src = dotted_shard(tmp_path / "dot" / "a.parquet").parent
    out = tmp_path / "out"
    model = ["--model", str(make_fake_model_dir(tmp_path / "model"))] if "--vectors-column" not in flags else []
    result = invoke(["index", str(src), "--out", str(out), "-q", *model, *flags],
                    env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "fake.log")})
    return result.exit_code, result.output, IndexReader(out) if result.exit_code == 0 else None


def stored(reader: IndexReader, *names: str) -> dict[str, list]:
    table = pq.read_table(reader.dir / "ids.parquet")
    order = np.argsort(table.column("row").to_numpy())
    return {n: [table.column(n)[int(i)].as_py() for i in order] for n in names}


def test_a_dotted_text_column_beside_a_struct_is_the_text_read(tmp_path):
    rc, output, reader = index(tmp_path, "--text-column", "body.en")
    assert rc == 0 and reader is not None, output
    assert stored(reader, "text") == {"text": TEXTS}


def test_a_dotted_id_column_beside_a_struct_is_the_id_read(tmp_path):
    rc, output, reader = index(tmp_path, "--id-column", "meta.id")
    assert rc == 0 and reader is not None, output
    assert stored(reader, "id") == {"id": [100, 101, 102]}


def test_a_dotted_vectors_column_beside_a_struct_is_the_vectors_read(tmp_path):
    rc, output, reader = index(tmp_path, "--vectors-column", "e.v", "--keep-columns", "body.en")
    assert rc == 0 and reader is not None, output
    assert reader.ntotal == 3 and reader.index.d == 2
    assert stored(reader, "body.en") == {"body.en": TEXTS}


def test_kept_dotted_columns_and_their_structs_are_stored_and_searched_as_named(tmp_path):
    rc, output, reader = index(tmp_path, "--keep-columns", "body.en,body,meta.id")
    assert rc == 0 and reader is not None, output
    assert stored(reader, "body.en", "body", "meta.id") == {
        "body.en": TEXTS, "body": [{"en": f"struct text {i}"} for i in range(3)], "meta.id": [100, 101, 102]}
    query = reader.index.reconstruct(0)[None, :]
    hits = reader.search(query, 3, where="body.en = 'bread rises in the oven'")
    assert [h.fields for h in hits[0]] == [{"body.en": TEXTS[1], "body": {"en": "struct text 1"}, "meta.id": 101}]


def test_embed_input_reads_the_dotted_text_column(tmp_path, tiny_bert_dir):
    shard = dotted_shard(tmp_path / "dot" / "a.parquet")
    result = invoke(["embed", "--input", str(shard), "--text-column", "body.en", "--id-column", "meta.id",
                     "--model", str(tiny_bert_dir)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in rows] == [100, 101, 102] and all("embedding" in r for r in rows), rows
    alone = json.loads(invoke(["embed", TEXTS[0], "--model", str(tiny_bert_dir)]).stdout)
    assert np.allclose(rows[0]["embedding"], alone["embedding"], atol=1e-5)  # the text of body.en, not the struct


@pytest.mark.parametrize("struct_first", [True, False])
def test_a_uint64_dotted_id_column_is_range_checked_by_its_own_statistics(tmp_path, struct_first):
    columns = {"meta": pa.array([{"id": 1}], pa.struct([("id", pa.uint64())])),
               "meta.id": pa.array([2**64 - 1], pa.uint64()), "text": ["glaciers"]}
    order = ["meta", "meta.id", "text"] if struct_first else ["meta.id", "meta", "text"]
    (tmp_path / "src").mkdir()
    pq.write_table(pa.table({k: columns[k] for k in order}), tmp_path / "src" / "a.parquet")
    result = invoke(["index", str(tmp_path / "src"), "--out", str(tmp_path / "out"), "-q", "--id-column", "meta.id",
                     "--model", str(make_fake_model_dir(tmp_path / "model"))],
                    env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "fake.log")})
    assert result.exit_code == 65 and "holds 18446744073709551615 at row 0" in result.output, result.output


def test_every_field_of_a_nested_schema_is_read_by_its_leaves(tmp_path):
    from petal.pipeline.ingest.exact_columns import _leaf_starts, iter_columns, read_columns, read_group_columns

    table = pa.table({
        "a": pa.array([{"b": 1, "c": [1, 2]}, None]),
        "a.b": ["x", "y"],
        "m": pa.array([[("k", 1)], []], pa.map_(pa.string(), pa.int64())),
        "ls": pa.array([[{"p": 1.0, "q": "r"}], None]),
        "d": pa.array(["u", "v"]).dictionary_encode(),
        "f": pa.array([[1, 2], [3, 4]], pa.list_(pa.int8(), 2)),
        "t": pa.array([1, 2], pa.time64("ns")),
    })
    pq.write_table(table, tmp_path / "n.parquet")
    pf = pq.ParquetFile(tmp_path / "n.parquet")
    assert _leaf_starts(pf.metadata) is not None  # the by-position path, not the by-name safety net
    for names in (["a.b"], ["a"], ["t", "a.b", "m"], table.column_names):
        want = pq.read_table(tmp_path / "n.parquet", columns=names).to_pylist()
        assert read_group_columns(pf, 0, names).to_pylist() == want
        assert read_columns(pf, names).to_pylist() == want
        assert pa.Table.from_batches(list(iter_columns(pf, names, 1))).to_pylist() == want


def test_no_fields_asked_reads_the_row_count_alone(tmp_path, monkeypatch):
    """``read_group_fields`` with no positions (a hit's metadata on a shard without metadata columns: petal serve's
    ``include: ["metadata"]``) gives the row group's row count without decoding a column; it read the whole group,
    text and every vector (39 -> 331 ms a search at 40k x 768)."""
    from petal.pipeline.ingest.exact_columns import read_group_fields

    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "c"], "n": [1, 2, 3]}), path)
    pf = pq.ParquetFile(path)

    def refuse(*args, **kwargs):
        raise AssertionError("a whole row group decoded")

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", refuse)
    table = read_group_fields(pf, 0, [])
    assert (table.num_rows, table.num_columns) == (3, 0)
