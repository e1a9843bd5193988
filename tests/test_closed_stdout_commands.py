"""Every command whose result goes to stdout, started with stdout closed (``>&-``), through the real entry point in
a fresh interpreter: 74 naming stdout before any work, as ``petal query`` and ``petal embed``
(tests/test_closed_outputs.py).

Before: ``petal index ... --json-report - >&-`` embedded and published, exit 0, the report written nowhere;
``petal rebuild --json``, ``petal info`` (and ``--json``), ``petal verify --json`` and every ``petal bench`` table
the same: exit 0 and the result lost. ``petal verify`` without ``--json`` still runs: its exit code is the verdict.
Also ``petal bench serve --serve-arg`` (checked by petal serve's own parser before any index is built) and
``--corpus``'s default outside the repository's root (a clear 66, after the usage errors)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "format1" / "out"


def petal(args: list[str], cwd: Path = REPO, close_stdout: bool = True) -> tuple[int, str, str]:
    """``petal ARGS`` with fd 1 closed (or captured): exit code, stdout, stderr."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("PETAL_TEST_FAKE_ENGINE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", "from petal.cli.main import main; main()", *args], cwd=cwd, env=env,
                          stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          stdout=None if close_stdout else subprocess.PIPE, text=True, timeout=300,
                          preexec_fn=(lambda: os.close(1)) if close_stdout else None)
    return done.returncode, done.stdout or "", done.stderr


def test_index_and_rebuild_reports_to_a_closed_stdout_are_74_before_any_work(tmp_path):
    pq.write_table(pa.table({"id": [1, 2], "text": ["glaciers move", "bread rises"]}), tmp_path / "a.parquet")
    out = tmp_path / "out"
    for extra in (["--json-report", "-"], ["--json"], ["--json", "--json-report", "-"]):
        code, _, err = petal(["index", str(tmp_path / "a.parquet"), "--out", str(out), "-q", *extra])
        assert code == 74 and "stdout is closed" in err and "Traceback" not in err, (extra, code, err)
        assert not out.exists(), extra  # nothing embedded, nothing published
    # NOTE: --json with a --json-report FILE runs (the report reaches the file): tests/test_closed_outputs.py
    index = tmp_path / "idx"
    shutil.copytree(FIXTURE, index, symlinks=True)
    before = sorted(p.name for p in (index / "versions").iterdir())
    for extra in (["--json"], ["--json-report", "-"]):
        code, _, err = petal(["rebuild", str(index), *extra])
        assert code == 74 and "petal rebuild" in err and "stdout is closed" in err, (extra, code, err)
    assert sorted(p.name for p in (index / "versions").iterdir()) == before  # no version built


def test_info_verify_json_and_bench_with_stdout_closed_are_74_verify_alone_runs(tmp_path):
    index = tmp_path / "idx"
    shutil.copytree(FIXTURE, index, symlinks=True)
    for args in (["info", str(index)], ["info", str(index), "--json"], ["verify", str(index), "--json"],
                 ["versions", str(index)], ["versions", str(index), "--json"],
                 ["bench", "cpu"], ["bench", "index", "--vectors", "1000", "--dim", "8"],
                 ["bench", "outputs"], ["bench", "startup"]):
        code, _, err = petal(args)
        assert code == 74 and "stdout is closed" in err and "Traceback" not in err, (args, code, err)
    code, _, err = petal(["verify", str(index)])  # NOTE: the verdict is the exit code; a mismatch is said on stderr
    assert code == 0, err


def test_bench_serve_args_are_judged_by_petal_serve_before_any_index_is_built(tmp_path):
    for serve_arg, words in ((["--serve-arg", "--bogus"], "No such option '--bogus'"),
                             (["--serve-arg=--max-k=0"], "'--max-k'"),
                             (["--serve-arg", "--max-wait-ms"], "'--max-wait-ms' requires an argument"),
                             (["--serve-arg", str(tmp_path)], "OUT (bench serve's --index"),
                             (["--serve-arg=--model=/m"], "--model (bench serve's --model"),
                             (["--serve-arg", "--help"], "--help starts no server")):
        code, out, err = petal(["bench", "serve", "--workdir", str(tmp_path / "w"), *serve_arg], close_stdout=False)
        assert code == 2 and "--serve-arg" in err and words in err, (serve_arg, code, err)
        assert out == "" and not (tmp_path / "w").exists()  # no index built, nothing written


def test_bench_corpus_default_outside_the_repository_says_to_give_corpus_after_usage_errors(tmp_path):
    for command in ("cpu", "e2e", "outputs", "serve"):
        code, _, err = petal(["bench", command], cwd=tmp_path, close_stdout=False)
        assert code == 66 and "--corpus not given" in err and "give --corpus" in err, (command, code, err)
    code, _, err = petal(["bench", "outputs", "--dims", "0"], cwd=tmp_path, close_stdout=False)
    assert code == 2 and "--dims" in err, err  # the usage error first
    code, _, err = petal(["bench", "cpu", "--corpus", "sample_data"], cwd=tmp_path, close_stdout=False)
    assert code == 66 and "--corpus sample_data: no such file" in err, err  # given: judged as any input
