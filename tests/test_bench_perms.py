"""``petal bench`` classifies permission denied by the path's role, as ``petal index`` / ``embed`` do: on what it
writes (``--workdir``, its server log, a temporary ``$TMPDIR/petal-*`` directory it made) 73, cannot create output;
on what it reads (``--model``, ``--corpus``, ``--tokenizer-dir``, ``--index``, the packaged model) 66; one line
naming the path. Before: a bare catch-all made every such error 74 (an I/O error: fix the disk and retry).

Real ``petal`` processes without the capabilities that bypass file modes (``setpriv`` when run as root), real
chmod-000 / 555 files and directories.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SAMPLE_DATA
from tests.fake_engine import make_fake_model_dir
from tests.test_serve_perms import closed, denial_is_real, unprivileged  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("denial_is_real")  # skipped where a chmod-000 file stays readable


def bench(tmp_path: Path, *argv: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = unprivileged([sys.executable, "-m", "petal.cli.main", "bench", *map(str, argv)])
    return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def last_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


def refused(proc: subprocess.CompletedProcess[str], code: int, path: Path) -> None:
    line = last_line(proc)
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    said = f"cannot create output: petal may not write {path}" if code == 73 else "petal may not read it"
    assert said in line and str(path) in line and "(permission denied)" in line, line


def test_an_output_inside_the_workdir_is_73(tmp_path):
    """--workdir itself can be written; what the benchmark writes inside it cannot (bench index judges its d<dim>
    directories up front, as --workdir: tests/test_bench_early_checks.py)."""
    work = tmp_path / "work"
    (work / "d384").mkdir(parents=True)
    with closed(work / "d384"):
        proc = bench(tmp_path, "index", "--workdir", work, "--vectors", 1000, "--dim", 384, "--queries", 10,
                     "--no-baseline")
    assert proc.returncode == 73 and f"--workdir {work / 'd384'}: cannot be read (Permission denied)" in last_line(
        proc), proc.stderr[-2000:]
    (work / "model-minilm").mkdir()
    with closed(work / "model-minilm"):
        proc = bench(tmp_path, "startup", "--workdir", work, "--runs", 1, "--vectors", 1000, "--no-baseline")
    # NOTE: the file named is the one whose check met the denial first (sentence_bert_config.json since fe34519, which
    # reuses a directory once it is whole): what is judged is that it lies inside the model directory
    refused(proc, 73, work / "model-minilm")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A model directory (config, safetensors, tokenizer) for the tests' fake engine: what is denied is its mode, and
    the index built with it is served by no real engine (bench serve fails at its log, before the server starts)."""
    return make_fake_model_dir(tmp_path_factory.mktemp("bench-perms") / "model")


def test_a_model_directory_petal_may_not_read_is_66(model, tmp_path):
    for argv in (["cpu", "--corpus", SAMPLE_DATA, "--texts", 16, "--rounds", 1],
                 ["outputs", "--corpus", SAMPLE_DATA, "--docs", 100, "--queries", 10]):
        with closed(model):
            proc = bench(tmp_path, *argv, "--model", model)
        refused(proc, 66, model)


def test_the_serve_benchmarks_log_is_73(model, tmp_path):
    """bench serve writes the server's log into --workdir: 73 naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2], "text": ["glaciers move", "vector search"]}), tmp_path / "docs.parquet")
    built = subprocess.run([sys.executable, "-m", "tests.fake_cli", "index", str(tmp_path / "docs.parquet"), "--out",
                            str(tmp_path / "out"), "--model", str(model), "-q"], capture_output=True, text=True,
                           cwd=REPO, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO),
                                                       "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "fake.jsonl")})
    assert built.returncode == 0, built.stderr[-3000:]
    work = tmp_path / "work"
    work.mkdir()
    (work / "serve.log").write_text("")  # an earlier run's log, recorded as the bench's own (bench/workdir.py)
    (work / ".petal-bench.json").write_text('{"written": ["serve.log"]}')
    with closed(work / "serve.log"):
        proc = bench(tmp_path, "serve", "--index", tmp_path / "out", "--workdir", work, "--corpus", SAMPLE_DATA,
                     "--tokens", 16, "--concurrency", 1, "--requests", 5, "--seconds", 1, "--endpoints", "embeddings")
    refused(proc, 73, work / "serve.log")


# A benchmark-shaped command: writes into a temporary directory it made ($TMPDIR/petal-*), reads --corpus (which may
# itself lie under $TMPDIR: what it reads wins), as petal bench e2e / outputs do.
COMMAND = """
import sys, tempfile
from pathlib import Path
import click
from petal.cli.bench import bench_errors

@click.command()
@click.option("--corpus", type=click.Path(path_type=Path, readable=False))
@click.option("--made", type=click.Path(path_type=Path, readable=False))
@bench_errors(writes=True)
def run(corpus, made):
    data = (corpus / "a.txt").read_bytes()
    (made / "out.bin").write_bytes(data)

run.main(sys.argv[1:], prog_name="petal")
"""


def test_a_temporary_directory_it_made_is_an_output_and_what_it_reads_is_input(tmp_path):
    tmp = tmp_path / "tmp"
    made, corpus = tmp / "petal-e2e-x", tmp / "petal-corpus"
    made.mkdir(parents=True)
    corpus.mkdir()
    (corpus / "a.txt").write_text("x")

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(unprivileged([sys.executable, "-c", COMMAND, "--corpus", str(corpus), "--made",
                                            str(made)]), capture_output=True, text=True, cwd=tmp_path, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)})

    made.chmod(0o555)
    try:
        refused(run(), 73, made / "out.bin")
    finally:
        made.chmod(0o755)
    with closed(corpus / "a.txt"):
        refused(run(), 66, corpus / "a.txt")  # under $TMPDIR/petal-*, but --corpus: read
