"""Dictionary-encoded columns (a pandas categorical, ``pa.array(...).dictionary_encode()``) are read as the values
they hold: a text, id or ``--keep-columns`` column stored as ``dictionary<values=string|int*>`` is indexed like its
plain twin, decoded one record batch at a time (never more than ``max_batch_bytes`` of decoded values at once), and
a ``dictionary<values=string, indices=int32>`` id column holds string ids, never integers.

Before: such a text column was refused (65, "has type dictionary<values=string ...>"); an id column of string values
was taken for an integer one (its type's name holds "int"): refused beside plain string ids, and a crash storing
them. Real ``petal index`` processes with the packaged model (forked from a preloaded interpreter: tests/forkrun.py),
real Parquet."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.parquet import inspect_shard, read_rows
from tests import forkrun


def petal(*args: str | Path) -> subprocess.CompletedProcess:
    """``petal ARGS`` (the packaged model) in its own process, forked from a preloaded interpreter (tests/forkrun.py);
    every path is absolute."""
    run = forkrun.petal([str(a) for a in args], env={"HF_HUB_OFFLINE": "1", "PETAL_TEST_FAKE_ENGINE": None},
                        timeout=300)
    return subprocess.CompletedProcess(["petal", *map(str, args)], run.rc, run.stdout, run.stderr)


def version_ids(out: Path) -> pa.Table:
    version = (out / "CURRENT").read_text().strip()
    return pq.read_table(out / "versions" / version / "ids.parquet")


def index(tmp_path: Path, *args: str | Path, out: str = "out") -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / f"{out}.json"
    done = petal("index", *args, "--out", tmp_path / out, "-q", "--json-report", report)
    assert "Traceback" not in done.stderr, done.stderr
    return done, json.loads(report.read_text())


TEXTS = ["glaciers retreat in summer", "a recipe for bread", "glaciers retreat in summer", "tidal energy"]


def test_dictionary_text_and_string_ids_index_as_plain_strings(tmp_path):
    pq.write_table(pa.table({"id": pa.array(["d0", "d1", "d2", "d3"]).dictionary_encode(),
                             "text": pa.array(TEXTS).dictionary_encode()}), tmp_path / "dict.parquet")
    pq.write_table(pa.table({"id": ["d0", "d1", "d2", "d3"], "text": TEXTS}), tmp_path / "plain.parquet")
    done, report = index(tmp_path, tmp_path / "dict.parquet")
    assert done.returncode == 0, done.stderr
    assert report["rows"]["embedded"] == 4
    ids = version_ids(tmp_path / "out")
    assert ids.schema.field("id").type == pa.string()  # string ids stay string ids
    assert ids.column("id").to_pylist() == ["d0", "d1", "d2", "d3"] and ids.column("text").to_pylist() == TEXTS
    # the same vectors as the plain shard's
    done, _ = index(tmp_path, tmp_path / "plain.parquet", out="plain")
    assert done.returncode == 0, done.stderr
    query = ["query", "--json", "-k", "4", "glaciers"]
    hits = [json.loads(petal(*query[:1], tmp_path / o, *query[1:]).stdout)["hits"]
            for o in ("out", "plain")]
    assert [(h["id"], round(h["score"], 5)) for h in hits[0]] == [(h["id"], round(h["score"], 5)) for h in hits[1]]


def test_a_pandas_categorical_text_column_with_integer_ids(tmp_path):
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"id": [10, 11, 12, 13], "text": pd.Categorical(TEXTS)})
    frame.to_parquet(tmp_path / "cat.parquet")
    assert pa.types.is_dictionary(pq.read_schema(tmp_path / "cat.parquet").field("text").type)
    done, _ = index(tmp_path, tmp_path / "cat.parquet")
    assert done.returncode == 0, done.stderr
    ids = version_ids(tmp_path / "out")
    assert ids.schema.field("id").type == pa.int64() and ids.column("id").to_pylist() == [10, 11, 12, 13]


def test_dictionary_string_ids_beside_plain_string_ids_are_one_kind(tmp_path):
    """``"int" in "dictionary<values=string, indices=int32, ordered=0>"``: the id kind must come from the values."""
    pq.write_table(pa.table({"id": pa.array(["a0", "a1"]).dictionary_encode(), "text": TEXTS[:2]}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": ["b0", "b1"], "text": TEXTS[2:]}), tmp_path / "b.parquet")
    done, _ = index(tmp_path, tmp_path / "a.parquet", tmp_path / "b.parquet")
    assert done.returncode == 0, done.stderr
    ids = version_ids(tmp_path / "out")
    assert ids.schema.field("id").type == pa.string() and ids.column("id").to_pylist() == ["a0", "a1", "b0", "b1"]
    # and a --delete of string ids reads them as strings (an integer file would be refused)
    pq.write_table(pa.table({"id": ["a1"]}), tmp_path / "del.parquet")
    done, _ = index(tmp_path, tmp_path / "a.parquet", tmp_path / "b.parquet", "--delete",
                         tmp_path / "del.parquet")
    assert done.returncode == 0, done.stderr
    assert version_ids(tmp_path / "out").column("id").to_pylist() == ["a0", "b0", "b1"]


def test_dictionary_integer_ids_beside_plain_integer_ids_and_a_string_shard_refused(tmp_path):
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()).dictionary_encode(), "text": TEXTS[:2]}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": pa.array([3, 4], pa.int32()), "text": TEXTS[2:]}), tmp_path / "b.parquet")
    done, _ = index(tmp_path, tmp_path / "a.parquet", tmp_path / "b.parquet")
    assert done.returncode == 0, done.stderr
    assert version_ids(tmp_path / "out").column("id").to_pylist() == [1, 2, 3, 4]
    pq.write_table(pa.table({"id": pa.array(["x"]).dictionary_encode(), "text": TEXTS[:1]}), tmp_path / "c.parquet")
    done, report = index(tmp_path, tmp_path / "a.parquet", tmp_path / "c.parquet", out="mixed")
    assert done.returncode == 65 and "is an integer in some shards and a string in others" in done.stderr, done.stderr
    assert "c.parquet (string)" in done.stderr and report["exit_code"] == 65


def test_strict_finds_dictionary_ids_repeated_across_shards(tmp_path):
    for name, ids in (("a", ["x", "y"]), ("b", ["y", "z"])):
        pq.write_table(pa.table({"id": pa.array(ids).dictionary_encode(), "text": TEXTS[:2]}),
                       tmp_path / f"{name}.parquet")
    done, _ = index(tmp_path, tmp_path / "a.parquet", tmp_path / "b.parquet", "--strict")
    assert done.returncode == 65 and 'id "y" in' in done.stderr, done.stderr


def test_vectors_column_with_dictionary_ids_text_and_kept_column(tmp_path):
    vectors = pa.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], pa.list_(pa.float32()))
    pq.write_table(pa.table({"id": pa.array(["p", "q", "r"]).dictionary_encode(), "emb": vectors,
                             "text": pa.array(["t1", "t2", "t1"]).dictionary_encode(),
                             "lang": pa.array(["en", "fr", "en"]).dictionary_encode()}), tmp_path / "v.parquet")
    done, _ = index(tmp_path, tmp_path / "v.parquet", "--vectors-column", "emb", "--keep-columns", "lang")
    assert done.returncode == 0, done.stderr
    ids = version_ids(tmp_path / "out")
    assert ids.schema.field("id").type == pa.string() and ids.schema.field("lang").type == pa.string()
    assert ids.select(["id", "text", "lang"]).to_pylist() == [
        {"id": "p", "text": "t1", "lang": "en"}, {"id": "q", "text": "t2", "lang": "fr"},
        {"id": "r", "text": "t1", "lang": "en"}]
    np.save(tmp_path / "q.npy", np.array([[1.0, 0.0]], np.float32))
    done = petal("query", tmp_path / "out", "--vector-file", tmp_path / "q.npy", "--json", "--where", "lang = 'en'")
    assert done.returncode == 0, done.stderr
    assert [h["id"] for h in json.loads(done.stdout)["hits"]] == ["p", "r"]


def test_a_dictionary_column_decodes_within_the_batch_byte_bound(tmp_path):
    """4096 rows of one 64 KiB category are 256 MiB decoded, from a few KiB of indices: the reader decodes a slice
    at a time, each at most ``max_batch_bytes`` of values, and loses no row."""
    big = "glacier " * 8192  # 64 KiB
    rows = 4096
    texts = pa.DictionaryArray.from_arrays(pa.array(np.arange(rows) % 2, pa.int32()), pa.array([big, "short"]))
    ids = pa.array(np.arange(rows), pa.int64())
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"id": ids, "text": texts}), path)
    read = ReadConfig(max_batch_bytes=1 << 20)
    info = inspect_shard(path, read)
    assert info.text_type == "string" and info.id_type == "int64"
    seen = []
    for batch in read_rows(0, info, read):
        assert sum(len(t) for t in batch.texts) <= read.max_batch_bytes
        assert batch.row_start == len(seen)
        seen.extend(batch.ids)
        assert all(t == (big if i % 2 == 0 else "short") for i, t in zip(batch.ids, batch.texts))
    assert seen == list(range(rows))
