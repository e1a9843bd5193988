"""A flag whose values a reader adds up, given twice: ``--delete A --delete B`` (a delete list split in two files),
``--keep-columns lang --keep-columns url``, ``petal query --where X --where Y``. click keeps the last value of a
repeated flag, so before: the first file's ids stayed indexed, the first column was not kept (and a column kept by
the live version left it), the first filter was dropped, all with exit 0. Now each is a usage error (2) naming the
flag and both values, before any work: the live version untouched, the report written."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from tests import forkrun
from tests.fake_engine import make_fake_model_dir


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> tuple[Path, Path, Path]:
    """``(root, data, out)``: one shard (ids a1..a3, columns lang and url) indexed with the fake engine."""
    root = tmp_path_factory.mktemp("repeated")
    make_fake_model_dir(root / "model")
    data = root / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": ["a1", "a2", "a3"], "text": ["first text", "second text", "third text"],
                             "lang": ["en", "fr", "de"], "url": ["u1", "u2", "u3"]}), data / "a.parquet")
    for name, ids in (("d1", ["a1"]), ("d2", ["a2"])):
        pq.write_table(pa.table({"id": ids}), root / f"{name}.parquet")
    result = index(root, data, root / "out", "--keep-columns", "lang")
    assert result.rc == 0, result.stderr
    return root, data, root / "out"


def index(root: Path, data: Path, out: Path, *extra: str | Path) -> forkrun.Result:
    """``petal index DATA --out OUT EXTRA...`` with the fake engine."""
    return forkrun.petal(["index", data, "--out", out, "--model", root / "model", "-q",
                          "--json-report", root / "report.json", *extra],
                         {"PETAL_TEST_FAKE_ENGINE": str(root / "fake.jsonl")})


def live_ids(out: Path) -> list[str]:
    return sorted(IndexReader(out).ids.column("id").to_pylist())


@pytest.mark.parametrize("flag, first, second", [("--delete", "d1.parquet", "d2.parquet"),
                                                 ("--keep-columns", "lang", "url")])
def test_a_repeated_index_flag_is_a_usage_error(indexed, flag, first, second):
    root, data, out = indexed
    version = (out / "CURRENT").read_text()
    values = [str(root / v) if flag == "--delete" else v for v in (first, second)]
    result = index(root, data, out, flag, values[0], flag, values[1])
    assert result.rc == 2, result.stderr
    assert flag in result.stderr and values[0] in result.stderr and values[1] in result.stderr, result.stderr
    assert "given 2 times" in result.stderr
    assert result.report is not None and result.report["exit_code"] == 2
    assert (out / "CURRENT").read_text() == version
    assert live_ids(out) == ["a1", "a2", "a3"]


def test_one_delete_and_one_keep_columns_still_work(indexed):
    root, data, out = indexed
    result = index(root, data, out, "--delete", root / "d1.parquet", "--keep-columns", "lang,url")
    assert result.rc == 0, result.stderr
    assert live_ids(out) == ["a2", "a3"]
    assert IndexReader(out).manifest.stored.keep == ("lang", "url")


def test_a_repeated_where_is_a_usage_error(tmp_path):
    result = forkrun.petal(["query", tmp_path / "none", "a query", "--where", "lang = 'en'", "--where", "url = 'u1'"])
    assert result.rc == 2, result.stderr
    assert "--where" in result.stderr and "given 2 times" in result.stderr
    assert "lang = 'en'" in result.stderr and "url = 'u1'" in result.stderr


def test_a_repeated_embed_input_is_a_usage_error(tmp_path):
    """``petal embed --input a.txt --input b.txt`` embedded b.txt only (exit 0): a.txt's texts were never read."""
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("first text\n")
    second.write_text("second text\n")
    output = tmp_path / "out.jsonl"
    result = forkrun.petal(["embed", "--input", first, "--input", second, "--output", output])
    assert result.rc == 2, result.stderr
    assert "--input" in result.stderr and "given 2 times" in result.stderr, result.stderr
    assert str(first) in result.stderr and str(second) in result.stderr, result.stderr
    assert not output.exists()
    result = forkrun.petal(["embed", "--input", first, "--output", output])  # one --input (the packaged model)
    assert result.rc == 0 and len(output.read_text().splitlines()) == 1, result.stderr


def test_a_repeated_query_vector_file_is_a_usage_error(indexed):
    """``petal query INDEX --vector-file q1.npy --vector-file q2.npy`` searched q2's rows only (exit 0)."""
    import numpy as np

    root, _, out = indexed
    files = [root / "q1.npy", root / "q2.npy"]
    for path in files:
        np.save(path, np.ones((1, 8), dtype=np.float32))
    result = forkrun.petal(["query", out, "--vector-file", files[0], "--vector-file", files[1], "--json"])
    assert result.rc == 2, result.stderr
    assert "--vector-file" in result.stderr and "given 2 times" in result.stderr, result.stderr
    assert str(files[0]) in result.stderr and str(files[1]) in result.stderr, result.stderr
    assert result.stdout == ""
