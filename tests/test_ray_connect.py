"""``petal index --ray``: connecting to the cluster and stopping the driver, in real processes (``python -m
tests.fake_cli``, the fake engine seam): an address where nothing answers is 75 in seconds, and a SIGTERM while Ray's
actors embed is the run's clean stop (143), as without Ray."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.fake_engine import make_fake_model_dir
from tests.test_scale_workers import write_shards

pytest.importorskip("ray")


def _petal(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    full = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    full.update({"PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false", **env})
    return subprocess.Popen([sys.executable, "-m", "tests.fake_cli", "index", *args, "-q"], env=full, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _index_ends(tmp_path, flags: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """``petal index`` of 2 small shards with the fake engine (its log: ``tmp_path/log.jsonl``) and ``flags``, run to
    its end: ``(exit code, stderr, its last line)``."""
    write_shards(tmp_path / "data", 2, 5)
    model = make_fake_model_dir(tmp_path / "model")
    process = _petal([str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--model", str(model), *flags],
                     {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl"), **env})
    try:
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    return process.returncode, stderr, (stderr.strip().splitlines() or [""])[-1]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed when the block ends: nothing listens there


@pytest.mark.parametrize("where", ["env", "flag"])
def test_a_ray_address_where_nothing_answers_is_75_in_seconds(tmp_path, where):
    """Before: ``ray.init`` retried the address for minutes (for ever from cron: no exit code at all)."""
    write_shards(tmp_path / "data", 1, 5)
    model = make_fake_model_dir(tmp_path / "model")
    address = f"127.0.0.1:{_closed_port()}"
    flag = ["--ray"] if where == "env" else ["--ray", address]
    env = {"RAY_ADDRESS": address} if where == "env" else {}
    process = _petal([str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--model", str(model), *flag],
                     {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl"), **env})
    try:
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 75, stderr
    assert f"cannot connect to Ray at {address}" in stderr and "Traceback" not in stderr, stderr
    assert ("(RAY_ADDRESS)" in stderr) == (where == "env"), stderr


@pytest.mark.parametrize("server", ["silent", "not_grpc"])
def test_a_ray_address_that_accepts_but_is_no_ray_cluster_is_75_in_seconds(tmp_path, server):
    """A loopback server that accepts connections and never answers (a hung head, a wrong port behind a proxy), or
    answers as something else (an HTTP/1 server: the dashboard's port given for the GCS's): 75 in seconds naming the
    address. Before, the TCP connect succeeded and ``ray.init`` waited on it for ever or for minutes."""
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    closing = threading.Event()

    def serve() -> None:
        while not closing.is_set():
            try:
                conn = listener.accept()[0]
            except OSError:
                continue
            held.append(conn)
            if server == "not_grpc":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    write_shards(tmp_path / "data", 1, 5)
    model = make_fake_model_dir(tmp_path / "model")
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    process = _petal([str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--model", str(model), "--ray", address],
                     {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")})
    try:
        _, stderr = process.communicate(timeout=40)
    finally:
        process.kill()
        closing.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()
    assert process.returncode == 75, stderr
    last = stderr.strip().splitlines()[-1]
    assert f"cannot connect to Ray at {address}" in last and "Traceback" not in stderr, stderr
    assert ("does not answer within" if server == "silent" else "not a Ray cluster's GCS") in last, last


@pytest.mark.slow
def test_sigterm_while_ray_actors_embed_is_143(tmp_path):
    """Before: ``ray.init`` had replaced petal's SIGTERM handler with its own ``sys.exit(15)``: the run ended as
    'internal error: SystemExit(15)' (exit 1 or 75), not as interrupted (143)."""
    write_shards(tmp_path / "data", 2, 5)
    model = make_fake_model_dir(tmp_path / "model")
    trace = tmp_path / "trace"
    process = _petal([str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--model", str(model), "--ray",
                      "--workers", "1"],
                     {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl"), "PETAL_FAULT": "engine_step:1+:sleep=60",
                      "PETAL_FAULT_TRACE": str(trace)})
    try:
        deadline = time.monotonic() + 60
        while not (trace.exists() and "engine_step" in trace.read_text()):  # an actor is inside a step
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()  # NOTE: stderr.read() of a child still running waited for its end: 60 s a step
                stderr = process.communicate(timeout=60)[1]
                pytest.fail(f"no actor inside a step within 60 s (exit {process.returncode}): {stderr}")
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 143, stderr
    assert "interrupted by SIGTERM" in stderr and "SystemExit" not in stderr, stderr


@pytest.mark.parametrize("scale", [["--ray"], ["--workers", "2"]])
def test_a_bad_start_timeout_is_78_before_ray_or_any_worker_starts(tmp_path, scale):
    """PETAL_WORKER_START_TIMEOUT=abc: 78 naming it in seconds, no local Ray started, no engine loaded. Before, --ray
    started a local Ray instance (and its actor pool's driver) first and refused the setting only then (~20 s)."""
    started = time.monotonic()
    code, stderr, last = _index_ends(tmp_path, scale, {"PETAL_WORKER_START_TIMEOUT": "abc",
                                                       "RAY_TMPDIR": str(tmp_path / "ray")})  # a local Ray's files
    log = tmp_path / "log.jsonl"
    assert code == 78, stderr
    assert "PETAL_WORKER_START_TIMEOUT='abc'" in last and "Traceback" not in stderr, stderr
    assert not (tmp_path / "ray").exists() and not log.exists() and time.monotonic() - started < 15, stderr


def test_a_local_ray_that_cannot_start_is_78_not_bad_input(tmp_path):
    """RAY_TMPDIR so long that a local Ray's sockets cannot live there: Ray refuses with an OSError of its own (no
    errno), which was taken for a file petal could not read: 65 'cannot read a file', bad input data. Now 78 naming
    Ray and the setting."""
    code, stderr, last = _index_ends(tmp_path, ["--ray"], {"RAY_TMPDIR": str(tmp_path / ("r" * 90))})
    assert code == 78, stderr
    assert "cannot start Ray" in last and "RAY_TMPDIR" in last and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("address, said", [
    ("", "an empty address"), ("bogus", "not HOST:PORT"), ("localhost:notaport", "port 'notaport'"),
    ("localhost:0", "port '0'"), ("127.0.0.1:70000", "port '70000'"),
    # another scheme than ray:// (was 75 with Ray's raw text; http:// 78 saying RAY_ADDRESS was set, it was not)
    ("foo://x", "the scheme foo:// is not a Ray cluster's"),
    ("http://127.0.0.1:8265", "the scheme http:// is not a Ray cluster's (an http:// address is a dashboard's"),
])
def test_a_malformed_ray_address_is_a_usage_error_never_retry(tmp_path, address, said):
    """A --ray ADDRESS Ray cannot parse was 75 ('retry': Airflow and cron retried a flag that never works), the empty
    one shown as 'RAY_ADDRESS/local'; now 2 naming the flag, before Ray starts. The API's ScaleConfig says the same."""
    from petal.pipeline.config import ScaleConfig

    code, stderr, _ = _index_ends(tmp_path, ["--workers", "2", "--ray", address], {})
    assert code == 2 and f"--ray {address!r}: {said}" in stderr and "Traceback" not in stderr, stderr
    with pytest.raises(ValueError, match=re.escape(said)):
        ScaleConfig(ray=True, ray_address=address)


@pytest.mark.parametrize("address", ["bogus", "localhost:notaport", "foo://x", "http://127.0.0.1:8265"])
def test_a_malformed_ray_address_env_is_78_naming_it(tmp_path, address):
    """The same address from RAY_ADDRESS (no flag to judge): 78, a setting of the environment, naming it."""
    code, stderr, last = _index_ends(tmp_path, ["--workers", "2", "--ray"], {"RAY_ADDRESS": address})
    assert code == 78 and f"{address} (RAY_ADDRESS)" in last and "Traceback" not in stderr, stderr
