"""``petal index --keep-columns``: a value that names no column, an empty name, a repeat or a name petal stores
itself is a usage error naming the flag (exit 2, before any shard is embedded); a column a shard lacks is a
data error naming file and column (exit 65, at preflight). Real tiny BERT, real Parquet and FAISS, the CLI."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

import petal
from petal.cli.main import cli
from petal.pipeline.index.search import IndexReader
from petal.pipeline.reliability.errors import UsageError


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    """Two shards; only the first has a ``year`` column."""
    data = tmp_path / "data"
    data.mkdir()
    for s, extra in enumerate([{"year": [2020, 2021, 2022]}, {}]):
        pq.write_table(pa.table({"id": [f"s{s}-{i}" for i in range(3)], "text": [f"text {s} {i}" for i in range(3)],
                                 "lang": ["en", "fr", "de"], **extra}), data / f"shard-{s}.parquet")
    return data


def index(data: Path, model: Path, keep: str):
    out = data.parent / "idx"
    result = CliRunner().invoke(cli, ["index", str(data), "--out", str(out), "--model", str(model), "-q",
                                      "--keep-columns", keep])
    return result, out


@pytest.mark.parametrize(("keep", "said"), [
    ("", "--keep-columns '' names no column"),
    ("   ", "--keep-columns '   ' names no column"),
    (" , ", "--keep-columns ' , ' names no column"),
    (",", "--keep-columns ',' names no column"),
    ("lang,,text2", "--keep-columns 'lang,,text2': an empty column name"),
    ("lang, ", "--keep-columns 'lang, ': an empty column name"),
    ("lang,lang", "names 'lang' twice"),
    ("lang, lang", "names 'lang' twice"),
    ("text", "--keep-columns 'text': that name is taken"),
    ("lang,id", "--keep-columns 'id': that name is taken"),
])
def test_flag_only_problems_are_usage_errors_naming_the_flag(shards, tiny_bert_dir, keep, said):
    result, out = index(shards, tiny_bert_dir, keep)
    assert result.exit_code == 2, result.output
    assert said in result.stderr, result.stderr
    assert not (out / "CURRENT").exists()  # nothing published (nor, before this, a full index without the columns)


def test_a_column_a_shard_lacks_is_a_data_error_naming_file_and_column(shards, tiny_bert_dir):
    result, out = index(shards, tiny_bert_dir, "lang,year")
    assert result.exit_code == 65, result.output
    assert "shard-1.parquet: no column 'year' (--keep-columns)" in result.stderr, result.stderr
    assert not (out / "CURRENT").exists()


def test_names_are_trimmed_and_kept(shards, tiny_bert_dir):
    result, out = index(shards, tiny_bert_dir, " lang ")
    assert result.exit_code == 0, result.output
    reader = IndexReader(out)
    assert reader.kept_columns == ["lang"]


def test_the_api_takes_the_same_rule(shards, tiny_bert_dir):
    out = shards.parent / "api-idx"
    for keep, said in [("", "names no column"), (["lang", "lang"], "names 'lang' twice"),
                       (["lang", ""], "an empty column name")]:
        with pytest.raises(UsageError, match=said):
            petal.index(shards, out, model=str(tiny_bert_dir), quiet=True, keep_columns=keep)
    petal.index(shards, out, model=str(tiny_bert_dir), quiet=True, keep_columns=[])  # a list: none kept
    assert IndexReader(out).kept_columns == []


def test_a_kept_column_whose_type_changes_between_shards(tmp_path, tiny_bert_dir):
    """Types that widen (int32 and int64, int and float) are stored as the wider one, whichever shard comes first;
    types that do not (int and string) are a data error naming the column, shards and types, never a traceback (a
    string that parses as a number was cast silently, one that does not crashed), whether both shards are in the
    run (at preflight) or one is kept from an earlier run."""
    data, out = tmp_path / "data", tmp_path / "idx"
    data.mkdir()

    def write(name: str, years: pa.Array) -> Path:
        ids = [f"{name}-{i}" for i in range(len(years))]
        pq.write_table(pa.table({"id": ids, "text": [f"text {i}" for i in ids], "year": years}), data / name)
        return data / name

    def run(*shards: Path) -> Result:
        return CliRunner().invoke(cli, ["index", *map(str, shards), "--out", str(out), "--model", str(tiny_bert_dir),
                                        "-q", "--keep-columns", "year"])

    a = write("a.parquet", pa.array([2001, 2002], pa.int32()))
    b = write("b.parquet", pa.array([2003.5, 2004.0]))
    assert run(a, b).exit_code == 0
    live = out / "versions" / (out / "CURRENT").read_text().strip() / "ids.parquet"
    assert pq.read_table(live, columns=["year"]).column("year").to_pylist() == [2001, 2002, 2003.5, 2004]
    c = write("c.parquet", pa.array(["2005", "y2006"]))
    result = run(a, b, c)  # all three named: refused at preflight
    assert result.exit_code == 65, result.output
    assert "'year'" in result.stderr and "c.parquet" in result.stderr and "string" in result.stderr
    result = run(c)  # a and b are kept from the store
    assert result.exit_code == 65, result.output
    assert "'year'" in result.stderr and "c.parquet" in result.stderr and "string" in result.stderr


@pytest.mark.parametrize("type_, values", [
    (pa.binary(), [b"\x00\xff", b"ab", None]),
    (pa.large_binary(), [b"a", b"b", b"c"]),
    (pa.binary(2), [b"ab", b"cd", b"ef"]),
    (pa.binary_view(), [b"a", b"b", b"c"]),
    (pa.dictionary(pa.int32(), pa.binary()), [b"a", b"a", b"b"]),
    (pa.list_(pa.binary()), [[b"q"], [], None]),
    (pa.struct([("x", pa.int64()), ("y", pa.binary())]), [{"x": 1, "y": b"z"}] * 3),
])
def test_a_kept_column_of_bytes_is_refused_before_any_work_naming_shard_column_and_type(tmp_path, tiny_bert_dir,
                                                                                        type_, values):
    # bytes came out as Python's b'...' in petal query (text and --json), serve and the API: no JSON-safe form
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["x", "y", "z"], "lang": ["en", "fr", "de"]}),
                   data / "fine.parquet")
    pq.write_table(pa.table({"id": ["d", "e", "f"], "text": ["x", "y", "z"], "lang": ["en", "fr", "de"],
                             "blob": pa.array(values, type_)}), data / "with bytes.parquet")
    result, out = index(data / "with bytes.parquet", tiny_bert_dir, "lang,blob")
    assert result.exit_code == 65, result.output
    said = result.stderr.splitlines()[-1]  # the type as the shard's footer gives it (Parquet names list items)
    assert 'with bytes.parquet": --keep-columns \'blob\' is ' in said and ", which holds bytes" in said, said
    assert "Traceback" not in result.output and not (out / "CURRENT").exists() and not (out / "store").exists()
    result, _ = index(data / "fine.parquet", tiny_bert_dir, "lang")  # a string column is kept as before
    assert result.exit_code == 0, result.output
