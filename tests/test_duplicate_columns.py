"""Parquet allows two columns of one name (pyarrow writes them): a shard whose text, id, ``--keep-columns`` or
``--vectors-column`` column is named twice, or a ``--delete`` file whose id column is, cannot be read by name.

Before: a ``KeyError: 'Column text does not exist in schema'`` traceback (exit 1) from the preflight, and for
``--delete`` 65 calling the file 'not a readable Parquet file' with Arrow's internal field list. Now 65 naming the
file and the column, before any model work; a duplicate name among the columns petal does not read is no
concern. A ``--delete`` file of ``string_view`` ids is read as a shard's ``string_view`` ids are (it was 65
'is string_view, not integer or string ids'). Real ``petal index`` processes with the packaged model."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_dictionary_columns import index


def shard(path, names: list[str], columns: list) -> None:
    pq.write_table(pa.Table.from_arrays([pa.array(c) for c in columns], names=names), path)


@pytest.mark.parametrize("names, flags, column", [
    (["id", "text", "text"], [], "text"),
    (["id", "id", "text"], [], "id"),
    (["id", "text", "lang", "lang"], ["--keep-columns", "lang"], "lang"),
    (["id", "vec", "vec"], ["--vectors-column", "vec"], "vec"),
])
def test_a_column_read_by_name_that_is_named_twice_is_65_naming_file_and_column(tmp_path, names, flags, column):
    values = {"id": [1, 2], "text": ["glaciers", "bread"], "lang": ["en", "fr"], "vec": [[1.0, 0.0], [0.0, 1.0]]}
    shard(tmp_path / "two of one.parquet", names, [values[n] for n in names])
    done, report = index(tmp_path, tmp_path / "two of one.parquet", *flags)
    assert done.returncode == 65, done.stderr
    assert f"two of one.parquet\": 2 columns are named {column!r}" in done.stderr, done.stderr
    assert report["status"] == "failed" and not (tmp_path / "out" / "store").exists()


def test_a_duplicate_name_petal_does_not_read_is_no_concern(tmp_path):
    shard(tmp_path / "a.parquet", ["id", "text", "x", "x"], [[1, 2], ["glaciers", "bread"], [1, 2], [3, 4]])
    done, report = index(tmp_path, tmp_path / "a.parquet")
    assert done.returncode == 0 and report["index"]["num_vectors"] == 2, done.stderr


def test_delete_files_with_a_doubled_id_column_or_string_view_ids(tmp_path):
    shard(tmp_path / "a.parquet", ["id", "text"], [["a", "b", "c"], ["glaciers", "bread", "tides"]])
    assert index(tmp_path, tmp_path / "a.parquet")[0].returncode == 0
    shard(tmp_path / "twice.parquet", ["id", "id"], [["a"], ["b"]])
    done, _ = index(tmp_path, tmp_path / "a.parquet", "--delete", tmp_path / "twice.parquet")
    assert done.returncode == 65 and "twice.parquet: 2 columns are named 'id'" in done.stderr, done.stderr
    pq.write_table(pa.table({"id": pa.array(["b"], pa.string_view())}), tmp_path / "view.parquet")
    done, report = index(tmp_path, tmp_path / "a.parquet", "--delete", tmp_path / "view.parquet")
    assert done.returncode == 0 and report["deletes"]["deleted"] == 1, done.stderr
    assert report["index"]["num_vectors"] == 2


@pytest.mark.parametrize("names, flags, column", [
    (["id", "text", "text"], [], "text"),
    (["id", "id", "text"], ["--id-column", "id"], "id"),
])
def test_embed_input_with_a_column_named_twice_is_65_naming_file_and_column(tmp_path, names, flags, column):
    """``petal embed --input`` reads its file as a shard: it was a KeyError traceback (exit 1)."""
    import subprocess
    import sys
    from pathlib import Path

    values = {"id": [1, 2], "text": ["glaciers", "bread"]}
    shard(tmp_path / "two.parquet", names, [values[n] for n in names])
    petal = str(Path(sys.executable).parent / "petal")
    output = tmp_path / ("e.jsonl" if flags else "e.npy")
    done = subprocess.run([petal, "embed", "--input", str(tmp_path / "two.parquet"), "--output", str(output),
                           *flags], capture_output=True, text=True, timeout=300)
    assert done.returncode == 65, done.stderr
    assert f"two.parquet: 2 columns are named {column!r}" in done.stderr and "Traceback" not in done.stderr
    assert not output.exists()
