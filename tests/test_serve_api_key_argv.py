"""``petal serve --api-key KEY``: the key is not left on the process's command line (which every user of the machine
reads with ``ps``); the flag wins over PETAL_API_KEY; a wrong key of any length is 401."""

from __future__ import annotations

from pathlib import Path

import pytest

from petal.cli.serve import argv_without_api_key

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")


def test_the_api_key_options_are_taken_out_of_the_command_line():
    base = ["python", "-m", "petal.cli.main", "serve", "OUT"]
    assert argv_without_api_key([*base, "--api-key", "k1", "--port", "0"], "k1") == [*base, "--port", "0"]
    assert argv_without_api_key([*base, "--api-key=k1"], "k1") == base
    # given twice (click takes the last): both go
    assert argv_without_api_key([*base, "--api-key", "k0", "--api-key=k1"], "k1") == base
    assert argv_without_api_key([*base, "--api-key", "k1", "--api-key", "k1"], "k1") == base
    assert argv_without_api_key(base, "k1") is None  # from PETAL_API_KEY
    assert argv_without_api_key([*base, "--", "--api-key", "k1"], "k1") is None  # positional after --


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")
@pytest.mark.parametrize("form", ["separate", "joined", "twice"])
def test_a_key_on_the_command_line_is_not_shown_by_ps_and_wins_over_the_variable(tmp_path, form):
    from petal.engine.loader import default_model_dir
    from tests.test_serve import Server

    key = "cli-key-0123456789"
    flag = {"separate": ["--api-key", key], "joined": [f"--api-key={key}"],
            "twice": ["--api-key", "old-key", "--api-key", key]}[form]  # click takes the last
    server = Server(tmp_path / "log", "--model", default_model_dir(), *flag, api_key_env="env-key")
    try:
        cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
        assert key.encode() not in cmdline and b"--api-key" not in cmdline, cmdline
        assert b"serve" in cmdline and b"--model" in cmdline
        post = lambda token: server.client.post(
            "/v1/embeddings", json={"input": "x"}, headers={"Authorization": f"Bearer {token}"} if token else {})
        assert post(key).status_code == 200
        for wrong in ("env-key", "old-key", key + "x", key[:-1], "k", key * 8, None):
            response = post(wrong)
            assert response.status_code == 401, (wrong, response.text)
            assert response.headers["www-authenticate"] == "Bearer"
        assert server.client.get("/metrics").status_code == 200  # no key needed (README)
    finally:
        server.stop()
    assert server.proc.returncode == 0


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")
def test_a_stop_signal_while_it_starts_again_without_the_key_exits_0(tmp_path):
    """SIGTERM just after the server started itself again without the key (the new interpreter still importing)
    is held, as in a server started without a key: exit 0, not killed (143)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from petal.engine.loader import default_model_dir

    log = tmp_path / "log"
    env = {k: v for k, v in os.environ.items() if k != "PETAL_API_KEY"}
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "serve", "--port", "0", "--model",
                                 str(default_model_dir()), "--api-key", "k-0123456789"],
                                stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    try:
        deadline = time.monotonic() + 60
        # NOTE: /proc/PID/cmdline reads empty while execve is under way (the new image's arguments are laid out
        # after Popen has returned, and after the re-exec's exec too): an empty read is not "started again". A signal
        # sent then reaches the first interpreter before it could block anything and kills it (-15), as it would
        # any process.
        while True:
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            if b"serve" in cmdline and b"--api-key" not in cmdline:
                break
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.001)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
        assert "petal serve: stopped (SIGTERM before the server started)" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
