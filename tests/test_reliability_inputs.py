"""Bad input, built in the test: exit code and message for bad shards, every bad row counted,
listed in the rejects file and never embedded (RELIABILITY.md promises 7 and 8)."""

from __future__ import annotations

import json
import time
import unicodedata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.layout import OutputDir
from tests.fake_cli import fake_hooks
from tests.fake_engine import embedded_ids, make_fake_model_dir, read_log
from tests.invariants import live, rejects_rows


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def index(tmp_path, fake_model):
    """``index(*sources, *flags)`` -> (exit code, stderr, report, fake-engine log) for --out tmp/out."""
    def run(*args: str | Path, out: Path | None = None):
        out = out or tmp_path / "out"
        report, log = tmp_path / "report.json", tmp_path / "fake.jsonl"
        report.unlink(missing_ok=True)
        log.unlink(missing_ok=True)
        result = CliRunner().invoke(cli, ["index", *map(str, args), "--out", str(out), "--model", str(fake_model),
                                          "-q", "--json-report", str(report)], obj=fake_hooks(str(log)))
        assert result.exit_code != 1, result.output  # never a bug
        return result.exit_code, result.stderr, json.loads(report.read_text()), log

    return run


def invalid_strings(values: list[bytes]) -> pa.Array:
    """A string column holding bytes that are not UTF-8 (pyarrow does not validate on read; other writers can)."""
    return pa.Array.from_buffers(pa.string(), len(values), pa.array(values, pa.binary()).buffers())


# (name, how to make the bad file, exit code, message) -- nothing is embedded and no output is created
def _truncated(path: Path) -> None:
    pq.write_table(pa.table({"id": [1], "text": ["x"]}), path)
    path.write_bytes(path.read_bytes()[:-20])


def _corrupt_page(path: Path) -> None:
    pq.write_table(pa.table({"id": list(range(2000)), "text": [f"text {i} " * 20 for i in range(2000)]}), path,
                   row_group_size=500, use_dictionary=False, compression="none")
    data = bytearray(path.read_bytes())
    start = pq.read_metadata(path).row_group(2).column(1).data_page_offset
    for i in range(start, start + 16):  # a page header in the middle: the footer still reads
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


BAD_FILES = [
    ("truncated footer", _truncated, 65, "not a readable Parquet file"),
    ("zero bytes", lambda p: p.write_bytes(b""), 65, "not a readable Parquet file"),
    ("not Parquet", lambda p: p.write_text("id,text\n1,hello\n"), 65, "not a readable Parquet file"),
    ("int text column", lambda p: pq.write_table(pa.table({"id": [1], "text": [3]}), p), 65,
     "text column 'text' has type int64"),
    ("missing text column", lambda p: pq.write_table(pa.table({"id": [1], "body": ["x"]}), p), 65,
     "text column 'text' is missing (columns: 'id', 'body')"),
    ("float id column", lambda p: pq.write_table(pa.table({"id": [1.5], "text": ["x"]}), p), 65,
     "id column 'id' has type double"),
    ("corrupt page header", _corrupt_page, 65, "corrupt data"),
]


@pytest.mark.parametrize("make, code, message", [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_bad_shard_fails_before_any_model_work(index, tmp_path, make, code, message):
    good = tmp_path / "data" / "a-good.parquet"
    good.parent.mkdir()
    pq.write_table(pa.table({"id": [10_000], "text": ["fine"]}), good)
    bad = tmp_path / "data" / "b-bad.parquet"
    make(bad)
    rc, stderr, report, log = index(tmp_path / "data")
    assert rc == code and message in stderr and str(bad) in stderr, stderr
    assert report["status"] == "failed" and report["exit_code"] == code and message in report["message"]
    if message != "corrupt data":  # footers and schemas: refused before the model loads, nothing written
        assert read_log(log) == [] and not (tmp_path / "out").exists()
    else:  # found while embedding, at the row group it spoils: 65 at once, never retried as an I/O error
        assert OutputDir(tmp_path / "out").current_version() is None and "cannot read rows from row" in stderr
        assert report["retries"]["read"] == 0


def test_missing_named_id_column_and_mixed_id_types(index, shard_writer):
    path = shard_writer("noid.parquet", {"text": ["a", "b"]})
    rc, stderr, _, _ = index(path, "--id-column", "doc")
    assert rc == 65 and "id column 'doc' is missing" in stderr
    rc, _, report, _ = index(path)  # not named: ids are <shard>:<row>
    assert rc == 0 and report["rows"]["embedded"] == 2
    other = shard_writer("strid.parquet", {"id": ["x"], "text": ["c"]})
    ints = shard_writer("intid.parquet", {"id": [1], "text": ["d"]})
    rc, stderr, _, _ = index(other, ints)
    assert rc == 65 and "integer in some shards and a string in others" in stderr


def test_no_input(index, tmp_path, shard_writer):
    (tmp_path / "empty").mkdir()
    rc, stderr, report, _ = index(tmp_path / "empty")
    assert rc == 66 and "no *.parquet files" in stderr and report["status"] == "failed"
    rc, stderr, _, _ = index(tmp_path / "missing.parquet")
    assert rc == 66 and "does not exist" in stderr
    zero_rows = shard_writer("zero.parquet", {"id": pa.array([], pa.int64()), "text": pa.array([], pa.string())})
    rc, stderr, report, log = index(zero_rows)
    assert rc == 66 and "no rows to index: 0 rows read" in stderr and embedded_ids(log) == []
    good = shard_writer("good.parquet", {"id": [1, 2], "text": ["one", "two"]})
    rc, _, report, _ = index(zero_rows, good)  # an empty shard beside others is fine
    assert rc == 0 and report["shards"]["total"] == 2 and report["rows"] == {
        "total": 2, "embedded": 2, "skipped": {}, "truncated": 0}


def test_every_bad_row_is_skipped_counted_listed_and_never_embedded(index, tmp_path, shard_writer):
    nfc = unicodedata.normalize("NFC", "café crème")
    nfd = unicodedata.normalize("NFD", "café crème")
    rows = [  # (id, text, reason or None)
        ("ok-1", "a normal document", None),
        ("null-text", None, "null_text"),
        ("empty", "", "empty_text"),
        ("blank", " \t\n\u3000", "empty_text"),
        ("controls", "\x00\x01\x07\x1b\u200b\ufeff", "empty_text"),
        ("ctrl-inside", "tab\tand\x00nul inside text", None),
        (None, "a row without id", "null_id"),
        ("ok-1", "the same id again", "duplicate_id"),
        ("poison", "this text embeds to poison", "non_finite_embedding"),
        ("nfc", nfc, None),
        ("nfd", nfd, None),
        ("emoji", "glaciers 🧊 move", None),
    ]
    a = shard_writer("a.parquet", {"id": [r[0] for r in rows], "text": [r[1] for r in rows]})
    raw = [(b"valid bytes", None), (b"\xff\xfe not utf-8", "invalid_utf8"), (b"\xed\xa0\x80 half", "lone_surrogate")]
    b = shard_writer("b.parquet", {"id": ["b0", "b1", "b2"], "text": pa.array([r[0] for r in raw], pa.binary())})
    c = shard_writer("c.parquet", {"id": ["c0", "c1", "c2"], "text": invalid_strings([r[0] for r in raw])})
    rc, stderr, report, log = index(a, b, c)
    assert rc == 0, stderr
    expected = sorted([(str(a), i, r[2]) for i, r in enumerate(rows) if r[2]]
                      + [(str(p), i, r[1]) for p in (b, c) for i, r in enumerate(raw) if r[1]])
    version_dir = OutputDir(tmp_path / "out").version_dir(report["version"])
    assert sorted(rejects_rows(version_dir)) == expected  # shard and row of every one, by reason
    assert report["rejects_file"] == str(version_dir / "rejects.parquet")
    assert report["rows"]["skipped"] == {"null_text": 1, "empty_text": 3, "null_id": 1, "duplicate_id": 1,
                                         "non_finite_embedding": 1, "invalid_utf8": 2, "lone_surrogate": 2}
    good = ["ok-1", "ctrl-inside", "nfc", "nfd", "emoji", "b0", "c0"]
    assert report["rows"]["embedded"] == len(good) and report["rows"]["total"] == len(rows) + 6
    ids, _ = live(tmp_path / "out")
    assert sorted(ids) == sorted(good)  # NFC and NFD spellings are two documents, embedded as given
    assert sorted(embedded_ids(log)) == sorted([*good, "poison"])  # poison reached the model, then was rejected
    assert "skipped" in stderr.splitlines()[-1]


def test_nfc_and_nfd_tokenize_alike_with_minilm(minilm_spec):
    """What petal documents: it never normalises; MiniLM's tokenizer strips accents, so both match."""
    from petal.pipeline.ingest.tokens import TextTokenizer

    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, 32)
    nfc, nfd = (unicodedata.normalize(form, "Crème brûlée") for form in ("NFC", "NFD"))
    assert nfc != nfd
    first, second = tokenizer.encode([nfc, nfd]).token_ids
    np.testing.assert_array_equal(first, second)


def test_a_10_mb_text_is_capped_truncated_and_counted(index, shard_writer):
    huge = ("word " * 2_100_000)[:10_000_000]
    path = shard_writer("huge.parquet", {"id": [1, 2, 3], "text": ["short", huge, "also short"]})
    started = time.perf_counter()
    rc, stderr, report, log = index(path)
    assert rc == 0, stderr
    assert time.perf_counter() - started < 30  # the character pre-cap: the tokenizer never sees 10 MB
    assert report["rows"]["truncated"] == 1 and report["rows"]["embedded"] == 3
    assert sorted(embedded_ids(log)) == [1, 2, 3]


def test_duplicate_ids_across_shards_keep_the_last_shard(index, shard_writer):
    a = shard_writer("a.parquet", {"id": [1, 2, 3], "text": ["one", "two", "three"]})
    b = shard_writer("b.parquet", {"id": [3, 4], "text": ["three again", "four"]})
    rc, _, report, _ = index(a, b)
    assert rc == 0 and report["index"]["superseded"] == 1 and report["index"]["num_vectors"] == 4
    ids, _ = live(Path(report["out"]))
    assert ids == [1, 2, 3, 4]


def test_strict_and_bad_row_budgets(index, tmp_path, shard_writer):
    a = shard_writer("a.parquet", {"id": list(range(10)), "text": [None, "", *[f"t{i}" for i in range(8)]]})
    b = shard_writer("b.parquet", {"id": list(range(10, 20)), "text": [*[f"u{i}" for i in range(9)], " "]})
    out_rejects = tmp_path / "out" / "rejects.parquet"
    rc, stderr, report, _ = index(a, b, "--strict")
    assert rc == 65 and "with --strict" in stderr and f"{a} row 0 (null_text)" in stderr
    assert report["status"] == "failed" and report["rejects_file"] == str(out_rejects)
    assert rejects_rows(out_rejects.parent) == [(str(a), 0, "null_text"), (str(a), 1, "empty_text")]
    assert report["rows"]["skipped"] == {"empty_text": 1, "null_text": 1}  # the refused run's report counts them
    rc, stderr, report, _ = index(a, b, "--max-bad-rows", "2")  # 3 bad rows: a's two, b's last
    assert rc == 65 and "3 bad rows with --max-bad-rows 2" in stderr and str(out_rejects) in stderr
    assert report["rows"]["skipped"] == {"empty_text": 2, "null_text": 1}
    assert sorted(rejects_rows(out_rejects.parent)) == [(str(a), 0, "null_text"), (str(a), 1, "empty_text"),
                                                        (str(b), 9, "empty_text")]
    rc, stderr, report, _ = index(a, b, "--max-bad-rows", "10%")  # 3 of 20 rows > 2
    assert rc == 65 and "(over 2 of 20 rows)" in stderr
    rc, stderr, report, _ = index(a, b, "--max-bad-rows", "0.15")  # 3 of 20 allowed
    assert rc == 0 and report["status"] == "success" and not out_rejects.exists()  # stale rejects removed
    assert sum(report["rows"]["skipped"].values()) == 3
    result = CliRunner().invoke(cli, ["index", str(a), "--out", str(tmp_path / "o2"), "--max-bad-rows", "lots"])
    assert result.exit_code == 2 and "--max-bad-rows 'lots'" in result.output
