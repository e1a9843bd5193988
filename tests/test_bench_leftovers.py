"""``petal bench`` leaves nothing behind and ends clearly, however it ends: no server or other child still running,
no ``$TMPDIR/petal-*`` directory, and a missing optional dependency or a child that failed is a message with an exit
code of the contract, never a traceback.

Before: ``bench serve`` and ``bench e2e`` left their temporary work directory (the index, its documents, the server
log, every run's output) and a ``--shape`` model's directory in ``$TMPDIR``; a stop signal while ``bench serve``'s
server started left the server running; a server that exited before it listened (the serve extra missing, a bad
``--serve-arg``) was a RuntimeError traceback (exit 1), and the missing extra was found only after the index was
built; sentence-transformers not installed was a traceback (``startup`` after its timed runs, ``e2e`` after its petal
runs, ``cpu`` after torch loaded); ``bench index --vectors`` under 4096 a FAISS traceback from its IVF4096 baseline;
a timed one-shot child of ``bench startup`` that failed a RuntimeError traceback; ``bench serve --endpoints embeddings``
without ``--model`` started petal serve with neither OUT nor a model (exit 2 from it, a traceback from the bench); a
server killed under load was a traceback in every client thread and an I/O error; ``--requests`` over several
``--client-processes`` was exceeded (each process's share rounded up); transformers not installed was a traceback
(``startup``'s after its timed runs).

Each case runs the real CLI (``python -m petal.cli.main bench ...``) in a fresh interpreter with its own ``TMPDIR``
and a marker in its environment: a process still carrying the marker after the bench ended is one it left running.
A module is made missing by a ``sitecustomize`` on ``PYTHONPATH`` (every child process of the bench gets it too).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO

BLOCKER = """import sys
class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {names!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _Missing())
"""


def environment(tmp_path: Path, missing: tuple[str, ...] = ()) -> dict[str, str]:
    """The bench's environment: its own ``TMPDIR``, a marker, and ``missing`` modules made unimportable."""
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PETAL_TEST_MARK": uuid.uuid4().hex,
           "PYTHONPATH": str(REPO)}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    if missing:
        shim = tmp_path / "shim"
        shim.mkdir(exist_ok=True)
        (shim / "sitecustomize.py").write_text(BLOCKER.format(names=missing))
        env["PYTHONPATH"] = f"{shim}{os.pathsep}{REPO}"
    return env


def marked(env: dict[str, str]) -> dict[int, str]:
    """The processes running with ``env``'s marker: their command lines by pid (zombies left out)."""
    found = {}
    needle = f"PETAL_TEST_MARK={env['PETAL_TEST_MARK']}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                found[int(pid)] = line.decode(errors="replace")
        except OSError:
            continue
    return found


def said(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """What ``proc`` wrote, for a failure's message: killed first if it still runs (``communicate()`` would wait for
    it: the rest of a 60 s bench row, or for ever)."""
    if proc.poll() is None:
        proc.kill()
    return proc.communicate(timeout=60)


def server_pid(env: dict[str, str], bench_proc: subprocess.Popen[str], timeout: float = 120) -> int:
    """The pid of the petal serve that ``bench_proc`` started, once it runs."""
    deadline = time.monotonic() + timeout
    while True:
        found = [pid for pid, line in marked(env).items() if " serve --port 0 " in line]
        if found:
            return found[0]
        assert bench_proc.poll() is None and time.monotonic() < deadline, said(bench_proc)
        time.sleep(0.05)


def assert_nothing_left(env: dict[str, str]) -> None:
    deadline = time.monotonic() + 10  # a process that was sent its signal may take a moment to go
    while marked(env) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not marked(env), marked(env)
    left = [p.name for p in Path(env["TMPDIR"]).iterdir() if p.name.startswith("petal-")]
    assert not left, left


def bench(env: dict[str, str], *argv: object, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "petal.cli.main", "bench", *map(str, argv)], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=timeout, stdin=subprocess.DEVNULL)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


SERVE = ("serve", "--endpoints", "embeddings", "--tokens", "16", "--concurrency", "1", "--requests", "5",
         "--seconds", "1")


def test_serve_with_a_shape_leaves_no_server_and_no_temporary_directory(tmp_path):
    """A --shape model and the work directory (server log) in $TMPDIR, removed; the row within its bounds."""
    env = environment(tmp_path)
    proc = bench(env, *SERVE, "--shape", "minilm", "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["server_exit_code"] == 0
    [row] = result["results"]
    assert 1 <= row["requests"] <= 5 and not row["errors"], row
    assert_nothing_left(env)


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


def test_serve_of_a_server_on_ipv6_loopback(tmp_path):
    """``--serve-arg=--host=::1``: the bench waited its whole start-up limit (900 s) for a server listening on
    ``http://[::1]:PORT`` (it read only an IPv4 address in the server's line)."""
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback here")
    env = environment(tmp_path)
    proc = bench(env, *SERVE, "--serve-arg=--host=::1", "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [row] = json.loads(proc.stdout)["results"]
    assert 1 <= row["requests"] <= 5 and not row["errors"], row
    assert_nothing_left(env)


def test_serve_of_embeddings_alone_serves_the_packaged_model(tmp_path):
    """No index and no --model: the packaged model, as documented (petal serve was started with neither: exit 2)."""
    env = environment(tmp_path)
    proc = bench(env, *SERVE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "all-MiniLM-L6-v2" in proc.stdout and "/v1/embeddings" in proc.stdout, proc.stdout
    assert "server exit status after SIGTERM: 0" in proc.stdout
    assert_nothing_left(env)


def test_a_stop_signal_while_the_server_starts_stops_it(tmp_path):
    """SIGTERM to the bench alone (systemd, kill PID) while its server loads: the server goes too, 143."""
    env = environment(tmp_path)
    bench_proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "bench", *SERVE], cwd=REPO, env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
    try:
        server_pid(env, bench_proc)
        bench_proc.send_signal(signal.SIGTERM)
        _, stderr = bench_proc.communicate(timeout=120)
    finally:
        bench_proc.kill()
    assert bench_proc.returncode == 143, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert_nothing_left(env)


@pytest.mark.parametrize(("stop", "code", "said"), [(signal.SIGKILL, 137, "petal serve was killed by SIGKILL"),
                                                     (signal.SIGTERM, 75, "petal serve stopped (exit 0)")])
def test_a_server_stopped_under_load_ends_the_bench_saying_so(tmp_path, stop, code, said):
    """The server gone mid-run (OOM killer, kill -9: 137; stopped by someone else, which it drains: 75, safe to
    retry) names it, at once; was a traceback in each client thread and an I/O error (74) from its /metrics, or
    exit 128 'petal serve exited 0'."""
    env = environment(tmp_path)
    log = tmp_path / "w" / "serve.log"
    bench_proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "bench", *SERVE[:-4], "--requests",
                                   "1000000", "--seconds", "60", "--workdir", str(tmp_path / "w")], cwd=REPO, env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pid = server_pid(env, bench_proc)
        deadline = time.monotonic() + 120
        while "listening on" not in log.read_text():
            assert bench_proc.poll() is None and time.monotonic() < deadline, said(bench_proc)
            time.sleep(0.1)
        time.sleep(1)
        os.kill(pid, stop)
        _, stderr = bench_proc.communicate(timeout=40)  # not the row's 60 s
    finally:
        bench_proc.kill()
    assert bench_proc.returncode == code, stderr[-2000:]
    assert "Traceback" not in stderr and "Exception in thread" not in stderr, stderr[-3000:]
    assert said in stderr.strip().splitlines()[-1], stderr[-2000:]
    assert_nothing_left(env)


def test_serve_sends_at_most_requests_over_client_processes(tmp_path):
    """--requests is the row's bound over every client process (each process's share was rounded up: 3 over two
    processes sent 4)."""
    env = environment(tmp_path)
    proc = bench(env, *SERVE[:-6], "--concurrency", "2", "--client-processes", "2", "--requests", "3",
                 "--seconds", "30", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    [row] = json.loads(proc.stdout)["results"]
    assert row["requests"] + sum(row["errors"].values()) == 3, row
    assert_nothing_left(env)


@pytest.mark.parametrize("case", ["serve extra missing", "bad --serve-arg"])
def test_a_server_that_cannot_start_is_its_exit_code_not_a_traceback(tmp_path, case):
    """The serve extra missing: 78 before any index is built (as petal serve says it); a --serve-arg petal serve
    refuses: 2 naming it, judged by petal serve's own parser before any index is built or server started (was: the
    server's exit 2 once the index was built)."""
    if case == "serve extra missing":
        env = environment(tmp_path, ("starlette", "uvicorn"))
        proc = bench(env, "serve", "--requests", "5", "--seconds", "1", "--concurrency", "1")
        assert proc.returncode == 78 and "pip install 'petal[serve]'" in proc.stderr, proc.stderr
        assert "starlette" in proc.stderr and "uvicorn" in proc.stderr
    else:
        env = environment(tmp_path)
        proc = bench(env, *SERVE, "--serve-arg=--max-wait-ms=-5")
        assert proc.returncode == 2, proc.stderr
        assert "--serve-arg" in proc.stderr and "--max-wait-ms" in proc.stderr, proc.stderr
        assert "petal serve refuses it" in proc.stderr, proc.stderr
    assert proc.stdout == ""
    assert_nothing_left(env)


def test_cpu_without_sentence_transformers_is_78_naming_it(tmp_path):
    """Its every ratio is to sentence-transformers: 78 naming it and the extra, before torch loads."""
    env = environment(tmp_path, ("sentence_transformers",))
    proc = bench(env, "cpu", "--texts", "16", "--rounds", "1", timeout=60)
    assert proc.returncode == 78, proc.stderr
    assert "sentence_transformers" in proc.stderr and "pip install 'petal[bench]'" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("argv", [("e2e", "--shape", "minilm", "--docs", "100"), ("serve", "--shape", "minilm"),
                                  ("startup", "--runs", "1", "--vectors", "1000", "--dim", "8")])
def test_without_transformers_a_random_weight_model_is_78_naming_it(tmp_path, argv):
    """A --shape model (startup's model-load scenario always makes one) is built with transformers: 78 naming it and
    the extra before any run (was a traceback: startup's after its timed runs)."""
    env = environment(tmp_path, ("transformers",))
    proc = bench(env, *argv, timeout=60)
    assert proc.returncode == 78, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "transformers" in last and "pip install 'petal[bench]'" in last, last
    assert proc.stdout == ""
    assert_nothing_left(env)


def test_startup_without_sentence_transformers_skips_its_baseline(tmp_path):
    """The script's row and its target are left out, said on stderr, in the table and in --json."""
    env = environment(tmp_path, ("sentence_transformers",))
    common = ("startup", "--runs", "1", "--vectors", "1000", "--dim", "8", "--device", "cpu")
    proc = bench(env, *common, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert "sentence_transformers" not in result
    assert "sentence-transformers" in result["skipped"], result.get("skipped")
    assert not any("sentence-transformers" in row["scenario"] for row in result["targets"])
    assert "baseline is skipped" in proc.stderr
    assert_nothing_left(env)


def test_a_timed_child_that_fails_is_its_exit_code_and_error_not_a_traceback(tmp_path):
    """petal embed failing in startup's timed runs (here its tokenizer module missing): its exit code and last line."""
    env = environment(tmp_path, ("tokenizers",))
    proc = bench(env, "startup", "--runs", "1", "--vectors", "1000", "--dim", "8", "--no-baseline", timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "petal.cli.main embed --device cpu" in last and "exited 1: ModuleNotFoundError" in last, last
    assert_nothing_left(env)


def test_e2e_with_a_shape_without_sentence_transformers_skips_its_baseline_and_leaves_nothing(tmp_path):
    """The --shape model's directory and the run's work directory (corpus, index) removed; the baseline skipped."""
    env = environment(tmp_path, ("sentence_transformers",))
    proc = bench(env, "e2e", "--shape", "minilm", "--docs", "100", "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["docs"] == 100 and "sentence_transformers_tokens_per_s" not in result
    assert "sentence-transformers" in result["skipped"]
    assert_nothing_left(env)


def test_index_under_4096_vectors_skips_the_ivf4096_baseline(tmp_path):
    """FAISS cannot train IVF4096 on fewer vectors: the row is skipped, the table and --json say why."""
    env = environment(tmp_path)
    common = ("index", "--vectors", "1000", "--dim", "8", "--queries", "10", "--shards", "2")
    table = bench(env, *common)
    assert table.returncode == 0, table.stderr[-2000:]
    assert "FAISS IVF4096,Flat: skipped" in table.stdout
    proc = bench(env, *common, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert [row["system"] for row in result["results"]] == ["FAISS IndexFlatIP", "petal (auto, --index-memory 8G)"]
    assert "4096" in result["skipped"]["FAISS IVF4096,Flat"]
    # said on stderr too, as the README promises of every skipped baseline (was: the table and JSON only)
    for run in (table, proc):
        assert "note: the FAISS IVF4096,Flat baseline is skipped: it trains on 4096 vectors or more" in run.stderr
    assert_nothing_left(env)


def _index_with_its_build_child(env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    """``bench index`` of 400k vectors started, once its build child (a spawned process) has been under way 0.5 s:
    the bench and the child's pid."""
    proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "bench", "index", "--vectors", "400000", "--dim",
                             "64", "--queries", "10", "--shards", "2", "--no-baseline"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=env, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not (children := [pid for pid, line in marked(env).items() if pid != proc.pid and "spawn_main" in line]):
            assert proc.poll() is None and time.monotonic() < deadline, said(proc)
            time.sleep(0.05)
    except BaseException:
        proc.kill()
        proc.communicate(timeout=60)
        raise
    time.sleep(0.5)  # the child under way
    return proc, children[0]


def test_index_stopped_while_its_build_child_runs_stops_it_at_once(tmp_path):
    """SIGTERM to ``bench index`` while its build child ran: the bench removed the child's directory and then waited
    for the child at exit (minutes at 1M vectors), which then failed on the files gone with a traceback of its own.
    Now the child is stopped with the bench: 143 at once, no traceback, nothing left."""
    env = environment(tmp_path)
    proc, _ = _index_with_its_build_child(env)
    try:
        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        assert time.monotonic() - stopped < 20, stderr
        assert proc.returncode == 143, stderr
        assert "Traceback" not in stderr, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)  # NOTE: bounded: its build child may hold the pipes
    assert_nothing_left(env)


def test_index_whose_build_child_is_killed_says_so_and_exits(tmp_path):
    """The build child killed while it built (the OOM killer's SIGKILL): the bench waited for its answer for good (a
    queue read without an end). Now it says the child was killed and exits, nothing left."""
    env = environment(tmp_path)
    proc, child = _index_with_its_build_child(env)
    try:
        os.kill(child, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 1, stderr
        last = stderr.strip().splitlines()[-1]
        assert "the index build (a child process) was killed by SIGKILL before it finished" in last, last
        assert "Traceback" not in stderr, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)  # NOTE: bounded: its build child may hold the pipes
    assert_nothing_left(env)


def test_serve_whose_every_request_was_refused_exits_2_saying_so(tmp_path):
    """--tokens past the model's max length: every request answered 413, and the bench printed an empty row and
    exited 0 (likewise -k past the server's --max-k, a --serve-arg=--api-key). Now the table, then 2 naming the row."""
    env = environment(tmp_path)
    proc = bench(env, "serve", "--endpoints", "embeddings", "--tokens", "300", "--concurrency", "1", "--requests", "3",
                 "--seconds", "1")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "/v1/embeddings" in proc.stdout  # the table is still printed
    last = proc.stderr.strip().splitlines()[-1]
    assert "measured nothing" in last and "413: " in last and "--tokens" in last, last
    assert_nothing_left(env)


def test_serve_workdir_index_is_rebuilt_for_other_index_docs(tmp_path):
    """--workdir's index was reused whatever --index-docs (or the corpus, the model) asked: a 100-document run after
    a 3000-document one served the 3000 documents, the table not saying so, and a stopped run's document shards
    leaked into the next index. Now the build's settings are recorded with it, and another set rebuilds it."""
    import petal

    env = environment(tmp_path)
    work = tmp_path / "work"
    common = ("serve", "--endpoints", "search", "--tokens", "16", "--concurrency", "1", "--requests", "3",
              "--seconds", "1", "--workdir", work, "--index-doc-tokens", "8", "--corpus", REPO / "sample_data")
    (work / "docs").mkdir(parents=True)
    stale = ["part-0001.parquet", "part-0002.parquet"]
    for name in stale:  # a stopped run's shards of another corpus, recorded as the bench's own (bench/workdir.py)
        (work / "docs" / name).write_bytes(b"PAR1 not this run's PAR1")
    (work / ".petal-bench.json").write_text(json.dumps({"written": ["docs"]}))
    (work / "docs" / ".petal-bench.json").write_text(json.dumps({"written": stale}))
    for docs in (100, 150, 150):
        proc = bench(env, *common, "--index-docs", docs)
        assert proc.returncode == 0, proc.stderr[-2000:]
        with petal.open_index(work / "out") as index:
            assert index.num_vectors == docs
    assert proc.stderr.count("building it again") == 0  # the same settings: reused
    assert_nothing_left(env)


def test_startup_rebuilds_vector_shards_a_stopped_run_left_incomplete(tmp_path):
    """A bench startup stopped while writing its vector shards left some of them: later runs built the index of
    those (150,000 of 400,000 vectors) and reported the size asked. Incomplete shards are written again."""
    script = """
import shutil, sys
from pathlib import Path
from petal.bench.startup import write_index_version, write_vector_shards
from petal.bench.workdir import Written
root = Path(sys.argv[1])
vectors = Written(root).claim("vectors-2000x16")  # recorded before written, as a run records them
write_vector_shards(vectors, 2000, 16)
(vectors / "vectors-007.parquet").unlink()  # a run stopped before its last shard
(vectors / "vectors-006.parquet").rename(vectors / "vectors-006.tmp")  # ... while writing it
out, factory, seconds = write_index_version(root, 2000, 16, "auto")
import petal
with petal.open_index(out) as index:
    print(index.num_vectors)
"""
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=environment(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["2000"], done.stdout


def test_startup_saves_again_a_model_directory_a_stopped_run_left_half_written(tmp_path):
    """bench startup reused --workdir's model directory once its model.safetensors existed: a run stopped while
    saving it (weights cut, sentence-transformers files not yet written) failed every later run (exit 1, after the
    timed runs). The directory is reused only once its last file is written."""
    script = """
import sys
from pathlib import Path
from petal.bench.startup import model_load, model_root
from petal.bench.workdir import Written
work = Path(sys.argv[1])
model_dir = Written(work).claim(model_root(work, "minilm").name)  # recorded before written, as a run records it
model_dir.mkdir(parents=True)
(model_dir / "model.safetensors").write_bytes(b"cut short")  # a save stopped in its first file
print(model_load("minilm", "cpu", 1, work)["shape"])
"""
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          timeout=600, cwd=REPO, env=environment(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "minilm", done.stdout


def test_e2e_stopped_while_petal_indexes_says_so_as_a_benchmark(tmp_path):
    """SIGTERM while e2e's in-process petal index runs: it said petal index's 'finished shards are committed, rerun to
    resume', though the benchmark removes that temporary index. Now a benchmark's line, still 143, nothing left."""
    env = environment(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "bench", "e2e", "--docs", "3000", "--device",
                             "cpu", "--no-baseline", "--corpus", str(REPO / "sample_data")], cwd=REPO, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not list(Path(env["TMPDIR"]).glob("petal-e2e-*/petal-out-0")):
            assert proc.poll() is None and time.monotonic() < deadline, said(proc)
            time.sleep(0.1)
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert "interrupted by SIGTERM; petal bench e2e removes its temporary work" in last, last
    assert "rerun" not in stderr and "Traceback" not in stderr, stderr[-2000:]
    assert_nothing_left(env)


def test_ctrl_c_during_serve_with_client_processes_is_said_once(tmp_path):
    """Ctrl-C (SIGINT to the whole process group) while ``bench serve --client-processes 2`` measured: 'petal:
    interrupted by SIGINT' was printed three times, once by each client process. Now once, 130, nothing left."""
    env = environment(tmp_path)
    log = tmp_path / "w" / "serve.log"
    proc = subprocess.Popen([str(Path(sys.executable).parent / "petal"), "bench", *SERVE[:-6], "--concurrency", "2",
                             "--client-processes", "2", "--requests", "1000000", "--seconds", "60", "--workdir",
                             str(tmp_path / "w")], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while len([line for line in marked(env).values() if "spawn_main" in line]) < 2:  # the client processes
            assert proc.poll() is None and time.monotonic() < deadline, said(proc)
            time.sleep(0.1)
        time.sleep(2)
        assert "listening on" in log.read_text()
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    assert stderr.count("interrupted by SIGINT") == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert_nothing_left(env)
