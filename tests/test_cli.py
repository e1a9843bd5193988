"""The CLI through click's CliRunner: index -> info -> query -> embed on sample_data, exit codes."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests.conftest import SAMPLE_DATA


@pytest.fixture(scope="module")
def built_index(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "idx"
    report = out.parent / "report.json"
    result = CliRunner().invoke(cli, ["index", str(SAMPLE_DATA), "--out", str(out), "--json-report", str(report),
                                      "-q"])
    assert result.exit_code == 0, result.output
    return out, json.loads(report.read_text()), result


def test_index_reports_every_count(built_index):
    _, report, result = built_index
    assert report["status"] == "success" and report["exit_code"] == 0
    assert report["shards"] == {"total": 3, "embedded": 3, "reused": 0}
    assert report["rows"]["total"] == 348 and report["rows"]["embedded"] == 342
    assert report["rows"]["skipped"] == {"null_text": 2, "empty_text": 3, "duplicate_id": 1}
    assert report["rows"]["truncated"] == 2
    assert report["index"]["num_vectors"] == 342 and report["index"]["factory"] == "Flat"
    assert "petal index: success" in result.stderr.splitlines()[-1]


def test_info_json_and_text(built_index):
    out, report, _ = built_index
    result = CliRunner().invoke(cli, ["info", str(out), "--json"])
    assert result.exit_code == 0
    manifest = json.loads(result.stdout)
    assert manifest["version"] == report["version"] and manifest["dim"] == 384 and manifest["metric"] == "ip"
    assert manifest["model"]["pooling"] == "mean" and manifest["model"]["normalize"] is True
    assert [s["rows"] for s in manifest["shards"]] == [117, 116, 115]
    text = CliRunner().invoke(cli, ["info", str(out)])
    assert text.exit_code == 0 and "342 x 384" in text.stdout and "Flat" in text.stdout


def test_query_finds_glacier_documents(built_index):
    out, _, _ = built_index
    result = CliRunner().invoke(cli, ["query", str(out), "how do glaciers move", "-k", "5", "--json", "--show-text"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout.strip())
    assert answer["query"] == "how do glaciers move" and len(answer["hits"]) == 5
    assert all("glacier" in hit["text"].lower() for hit in answer["hits"][:3])
    scores = [hit["score"] for hit in answer["hits"]]
    assert scores == sorted(scores, reverse=True)
    table = CliRunner().invoke(cli, ["query", str(out), "espresso and coffee", "-k", "3"])
    assert table.exit_code == 0 and table.stdout.count("doc-") == 3


def test_query_stdin_answers_each_line(built_index):
    out, _, _ = built_index
    result = CliRunner().invoke(cli, ["query", str(out), "--stdin", "--json", "-k", "2"],
                                input="volcano eruption\n\nsourdough bread\n")
    assert result.exit_code == 0
    lines = [json.loads(x) for x in result.stdout.splitlines()]
    # the blank line answered in its place, as skipped
    assert [x["query"] for x in lines] == ["volcano eruption", "", "sourdough bread"]
    assert [x.get("skipped") for x in lines] == [None, "empty_text", None] and lines[1]["hits"] == []


def test_query_longer_than_the_model_limit_is_answered_and_counted(built_index):
    """The rule of petal index and petal embed: a truncated text is counted and said (was: truncated silently)."""
    out, _, _ = built_index
    long_query = "glaciers carve valleys " * 20_000
    result = CliRunner().invoke(cli, ["query", str(out), "--stdin", "--json", "-k", "1"],
                                input=f"{long_query}\nvolcano\n")
    assert result.exit_code == 0, result.output
    assert [json.loads(x)["query"] for x in result.stdout.splitlines()] == [long_query, "volcano"]
    assert "1 query longer than 256 tokens, truncated" in result.stderr
    short = CliRunner().invoke(cli, ["query", str(out), "volcano", "-k", "1"])
    assert short.exit_code == 0 and "truncated" not in short.stderr


def test_query_k_larger_than_index(built_index):
    out, _, _ = built_index
    result = CliRunner().invoke(cli, ["query", str(out), "anything", "-k", "5000", "--json"])
    hits = json.loads(result.stdout)["hits"]
    assert len(hits) == 342 and len({h["id"] for h in hits}) == 342


def test_rerun_with_nothing_changed_does_nothing(built_index, tmp_path):
    out, report, _ = built_index
    again = tmp_path / "again.json"
    result = CliRunner().invoke(cli, ["index", str(SAMPLE_DATA), "--out", str(out), "--json-report", str(again), "-q"])
    assert result.exit_code == 0
    second = json.loads(again.read_text())
    assert second["status"] == "nothing-to-do" and second["version"] == report["version"]
    assert second["shards"] == {"total": 3, "embedded": 0, "reused": 3}


def test_new_shard_embeds_only_that_shard(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(SAMPLE_DATA, data, ignore=shutil.ignore_patterns("*.py", "*.md", "*.tsv"))
    out = tmp_path / "idx"
    runner = CliRunner()
    assert runner.invoke(cli, ["index", str(data), "--out", str(out), "-q"]).exit_code == 0
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ["new-1", "new-2"], "text": ["A brand new document about lighthouses.",
                                                               "Another new one about tide pools."]}),
                   data / "shard-003.parquet")
    report = tmp_path / "r.json"
    args = ["index", str(data), "--out", str(out), "-q", "--json-report", str(report)]
    assert runner.invoke(cli, args).exit_code == 0
    r = json.loads(report.read_text())
    assert r["shards"] == {"total": 4, "embedded": 1, "reused": 3} and r["index"]["num_vectors"] == 344
    hit = json.loads(runner.invoke(cli, ["query", str(out), "lighthouse", "-k", "1", "--json"]).stdout)["hits"][0]
    assert hit["id"] == "new-1"


def test_embed_outputs_in_input_order(tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["embed", "first text", "second text"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["index"] for r in rows] == [0, 1] and len(rows[0]["embedding"]) == 384
    npy = tmp_path / "v.npy"
    src = tmp_path / "in.txt"
    src.write_text("second text\nfirst text\n")
    assert runner.invoke(cli, ["embed", "--input", str(src), "--output", str(npy)]).exit_code == 0
    vectors = np.load(npy)
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32
    first = np.array(rows[0]["embedding"], dtype=np.float32)
    np.testing.assert_allclose(vectors[1], first, atol=1e-6)
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text('{"text": "first text"}\n')
    out = runner.invoke(cli, ["embed", "--input", str(jsonl)])
    np.testing.assert_allclose(json.loads(out.stdout)["embedding"], first, atol=1e-6)
    stdin = runner.invoke(cli, ["embed", "--stdin"], input="first text\n")
    np.testing.assert_allclose(json.loads(stdin.stdout)["embedding"], first, atol=1e-6)
    parquet = runner.invoke(cli, ["embed", "--input", str(SAMPLE_DATA / "shard-002.parquet")])
    assert parquet.exit_code == 0 and "skipped (empty_text" in parquet.stderr  # the rule of petal index


def test_embed_of_an_empty_input_is_no_input_not_a_usage_error(tmp_path):
    """--input FILE or --stdin given and empty: exit 66 naming it (as an input of blank lines only); no TEXT and
    no input flag at all: a usage error (2)."""
    runner = CliRunner()
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    result = runner.invoke(cli, ["embed", "--input", str(empty)])
    assert result.exit_code == 66 and "empty.txt is empty" in result.stderr, result.output
    result = runner.invoke(cli, ["embed", "--stdin"], input="")
    assert result.exit_code == 66 and "--stdin is empty" in result.stderr, result.output
    result = runner.invoke(cli, ["embed"])
    assert result.exit_code == 2 and "give TEXT, --stdin or --input" in result.output, result.output


def test_embed_output_that_cannot_be_created_is_73_before_the_model_loads(tmp_path):
    """--output in a directory that is not there, or a directory itself: exit 73 naming it, before any model work
    (was: 74 after every text was embedded)."""
    runner = CliRunner()
    (tmp_path / "d.npy").mkdir()
    gone = "gone is not a directory"
    for output, said in [(tmp_path / "gone" / "v.npy", gone), (tmp_path / "d.npy", "is a directory"),
                         (tmp_path / "gone" / "v.jsonl", gone)]:
        result = runner.invoke(cli, ["embed", "some text", "--output", str(output),
                                     "--model", str(tmp_path / "no-model")])
        assert result.exit_code == 73 and f"--output {output}" in result.stderr and said in result.stderr, result.output


def test_exit_codes(tmp_path, shard_writer):
    runner = CliRunner()
    out = str(tmp_path / "o")
    bad = shard_writer("bad.parquet", {"id": [1], "text": [3]})
    r = runner.invoke(cli, ["index", str(bad), "--out", out, "-q"])
    assert r.exit_code == 65 and "bad.parquet" in r.stderr and "int64" in r.stderr
    r = runner.invoke(cli, ["index", str(tmp_path / "nothing"), "--out", out, "-q"])
    assert r.exit_code == 66
    all_bad = shard_writer("empty-texts.parquet", {"id": [1, 2], "text": ["", None]})
    r = runner.invoke(cli, ["index", str(all_bad), "--out", out, "-q"])
    assert r.exit_code == 66 and "no rows to index" in r.stderr
    good = shard_writer("good.parquet", {"id": [1], "text": ["fine"]})
    r = runner.invoke(cli, ["index", str(good), "--out", out, "--model", str(tmp_path / "no-model"), "-q"])
    assert r.exit_code == 78 and "no-model" in r.stderr
    pickle_only = tmp_path / "pickle-model"
    pickle_only.mkdir()
    (pickle_only / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert",
                                                         "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
                                                         "num_attention_heads": 2, "intermediate_size": 8,
                                                         "max_position_embeddings": 16}))
    (pickle_only / "pytorch_model.bin").write_bytes(b"not loaded")
    r = runner.invoke(cli, ["index", str(good), "--out", out, "--model", str(pickle_only), "-q"])
    assert r.exit_code == 78 and "pickle" in r.stderr
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = runner.invoke(cli, ["index", str(good), "--out", str(blocker / "sub"), "-q"])
    assert r.exit_code == 73
    r = runner.invoke(cli, ["index", str(good), "--out", out, "--token-budget", "64", "-q"])
    assert r.exit_code == 2 and "token budget" in r.output
    r = runner.invoke(cli, ["index", str(good), "--out", out, "--strict", "-q"])
    assert r.exit_code == 0
    r = runner.invoke(cli, ["index", str(all_bad), str(good), "--out", str(tmp_path / "s"), "--strict", "-q"])
    assert r.exit_code == 65 and "--strict" in r.stderr
    r = runner.invoke(cli, ["query", str(tmp_path / "not-an-index"), "x"])
    assert r.exit_code == 78


def test_settings_drift_is_refused_unless_full(tmp_path, shard_writer):
    runner = CliRunner()
    good = shard_writer("good.parquet", {"id": [1, 2], "text": ["fine", "also fine"]})
    out = str(tmp_path / "o")
    assert runner.invoke(cli, ["index", str(good), "--out", out, "-q"]).exit_code == 0
    r = runner.invoke(cli, ["index", str(good), "--out", out, "--max-length", "128", "-q"])
    assert r.exit_code == 78 and "max_length: 256 -> 128" in r.stderr and "--full" in r.stderr
    r = runner.invoke(cli, ["index", str(good), "--out", out, "--max-length", "128", "--full", "-q"])
    assert r.exit_code == 0


def test_second_writer_exits_75(tmp_path, shard_writer):
    from petal.pipeline.layout import OutputDir

    good = shard_writer("good.parquet", {"id": [1], "text": ["fine"]})
    out = OutputDir(tmp_path / "o")
    out.prepare()
    with out.lock():
        r = CliRunner().invoke(cli, ["index", str(good), "--out", str(out.root), "-q"])
    assert r.exit_code == 75 and "pid" in r.stderr


def test_help_lists_commands_without_heavy_imports():
    import subprocess
    import sys

    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for command in ("index", "query", "embed", "info", "bench"):
        assert command in result.stdout
    probe = "import sys, cli.main; print(sorted(m for m in ('torch', 'faiss', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip() == "[]"  # petal --help stays instant


@pytest.mark.parametrize("value", ["abc", "0"])
def test_bad_tokenize_workers_setting_fails_before_any_work(tmp_path, value):
    out = tmp_path / "idx"
    result = CliRunner().invoke(cli, ["index", str(SAMPLE_DATA), "--out", str(out), "-q"],
                                env={"PETAL_TOKENIZE_WORKERS": value})
    assert result.exit_code == 2
    assert f"PETAL_TOKENIZE_WORKERS={value!r}" in result.output
    assert not out.exists()  # refused before the output directory was touched


def test_embed_input_without_a_named_column_or_id_names_it(tmp_path):
    """--input FILE.parquet without the --text-column / --id-column asked for: exit 65 naming the missing one and
    the file's own columns (not pyarrow's internal fields); a .jsonl line without the --id-column key: 65 naming
    the line, never a silent null id."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    runner = CliRunner()
    shard = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"body": ["a text"], "key": [7]}), shard)
    result = runner.invoke(cli, ["embed", "--input", str(shard), "--text-column", "body", "--id-column", "doc_id"])
    assert result.exit_code == 65, result.output
    assert "no column 'doc_id' (--id-column); it has 'body', 'key'" in result.stderr
    assert "__fragment" not in result.stderr and "'body' (--text-column)" not in result.stderr
    result = runner.invoke(cli, ["embed", "--input", str(shard)])
    assert result.exit_code == 65 and "no column 'text' (--text-column)" in result.stderr, result.output
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"text": "first", "key": 1}\n\n{"text": "second"}\n')
    result = runner.invoke(cli, ["embed", "--input", str(lines), "--id-column", "key"])
    assert result.exit_code == 65 and "in.jsonl:3: no 'key' field (--id-column)" in result.stderr, result.output
    lines.write_text('{"text": "first", "key": 1}\n{"text": "second", "key": null}\n')
    result = runner.invoke(cli, ["embed", "--input", str(lines), "--id-column", "key"])
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == [1, None]  # a null given is kept


def test_embed_int8_messages_say_what_to_do(built_index):
    """One text with --quantize int8 cannot calibrate its own ranges: the error says --calibration INDEX; an index
    without int8 ranges given to --calibration is described in words, not a Python dict."""
    out, _, _ = built_index
    runner = CliRunner()
    result = runner.invoke(cli, ["embed", "one text", "--quantize", "int8"])
    assert result.exit_code == 2 and "--calibration INDEX" in result.output, result.output
    result = runner.invoke(cli, ["embed", "one text", "--quantize", "int8", "--calibration", str(out)])
    assert result.exit_code == 2 and "holds no int8 ranges" in result.output, result.output
    assert "it holds float32 vectors of dim 384" in result.output and "renormalize" not in result.output
