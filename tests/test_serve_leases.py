"""A version that ``petal serve`` serves is not deleted by a ``petal index`` run: the server holds a lease on it
(a shared flock on its manifest, pipeline/layout.py ``VersionLease``), pruning keeps a leased version and says
so, the lease goes with the version once the server moved on (or with the process, even after kill -9).

Real components: ``petal index`` runs (child processes), a real ``petal serve`` child on a loopback port, real
HTTP (httpx)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._serve_shared import sample_out
from tests.conftest import SAMPLE_DATA

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> tuple[Path, Path]:
    """sample_data indexed once with the packaged MiniLM: (data, OUT), the session's shared index
    (tests/_serve_shared.py); each test works on a copy of OUT, and petal index only reads DATA."""
    return SAMPLE_DATA, sample_out(tmp_path_factory)


def index(data: Path, out: Path, *args: object) -> tuple[dict, str]:
    """``petal index DATA --out OUT ARGS``: its report and stderr."""
    report = out.parent / f"report-{time.monotonic_ns()}.json"
    run = subprocess.run([sys.executable, "-m", "petal.cli.main", "index", str(data), "--out", str(out),
                          "--json-report", str(report), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return json.loads(report.read_text()), run.stderr


def rebuild_out(out: Path, *args: object) -> tuple[dict, str]:
    """``petal rebuild OUT ARGS`` (a publish): its report and stderr."""
    report = out.parent / f"report-{time.monotonic_ns()}.json"
    run = subprocess.run([sys.executable, "-m", "petal.cli.main", "rebuild", str(out), "--json-report", str(report),
                          *map(str, args)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    return json.loads(report.read_text()), run.stderr


def current(out: Path) -> str:
    return (out / "CURRENT").read_text().strip()


def leased(version_dir: Path) -> bool:
    """Whether a reader holds ``version_dir`` (what pruning asks: an exclusive flock on its manifest, not waiting)."""
    fd = os.open(version_dir / "manifest.json", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def wait_for(predicate, what: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def serve(out: Path, log: Path):
    from tests.test_serve import Server

    return Server(log, out, "--reload-interval-s", "0.1")


def search_text(server, query: str = "how do glaciers move") -> dict:
    answer = server.client.post("/search", json={"query": query, "k": 3, "include": ["text", "metadata"]})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_keep_versions_1_keeps_the_version_a_server_still_serves_after_refusing_the_new_one(indexed, tmp_path,
                                                                                           tiny_bert_dir):
    """The defect: a re-index with another model and --keep-versions 1 published v2, the server refused it and
    kept serving v1, and the run deleted v1 under it. Now v1 stays (the report's pruned.in_use and a stderr note
    name it), the server keeps answering from its files; once the server is gone (kill -9), the next run prunes
    it."""
    data, template = indexed
    out = tmp_path / "out"
    shutil.copytree(template, out, ignore=shutil.ignore_patterns(".lock"))
    v1 = current(out)
    server = serve(out, tmp_path / "server.log")
    try:
        assert server.client.get("/ready").json()["version"] == v1
        before = search_text(server)
        report, stderr = index(data, out, "--model", tiny_bert_dir, "--full", "--keep-versions", "1")
        v2 = current(out)
        assert v2 != v1 and report["version"] == v2
        refused = wait_for(lambda: server.client.get("/ready").json().get("refused"), "the refusal")
        assert (refused["version"], refused["reason"]) == (v2, "model"), refused
        assert (out / "versions" / v1 / "manifest.json").is_file(), "the version served was pruned"
        assert leased(out / "versions" / v1)
        assert report["pruned"] == {**report["pruned"], "versions": [], "in_use": [v1]}, report["pruned"]
        assert f"kept {v1}" in stderr and "in use by a reader" in stderr, stderr
        # still served whole: the stored text and the shards' metadata, from the version's own files
        after = search_text(server)
        assert after["version"] == v1 and after == before
        assert all(hit["text"] for hit in after["results"][0]["hits"])
        # the server dies without a word: the kernel drops its lease; the next run prunes v1
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(30)
        report, stderr = index(data, out, "--model", tiny_bert_dir, "--keep-versions", "1")
        assert report["status"] == "nothing-to-do" and report["pruned"]["versions"] == [v1], report["pruned"]
        assert report["pruned"]["in_use"] == [] and "kept" not in stderr
        assert sorted(p.name for p in (out / "versions").iterdir()) == [v2]
    finally:
        server.stop()


def test_the_version_a_server_moved_on_from_is_released(indexed, tmp_path):
    """A compatible new version is followed; the old one's lease goes with it (no request holds it), so the next
    publish may prune it (a run that publishes nothing prunes nothing by its own --keep-versions), and the version now
    served is leased instead."""
    data, template = indexed
    out = tmp_path / "out"
    shutil.copytree(template, out, ignore=shutil.ignore_patterns(".lock"))
    v1 = current(out)
    server = serve(out, tmp_path / "server.log")
    try:
        assert leased(out / "versions" / v1)
        rebuild = subprocess.run([sys.executable, "-m", "petal.cli.main", "rebuild", str(out)],
                                 capture_output=True, text=True, timeout=600)
        assert rebuild.returncode == 0, rebuild.stderr
        v2 = current(out)
        wait_for(lambda: server.client.get("/ready").json()["version"] == v2, "the swap")
        wait_for(lambda: not leased(out / "versions" / v1), f"the lease on {v1} to be released")
        assert leased(out / "versions" / v2) and search_text(server)["version"] == v2
        report, stderr = index(data, out, "--keep-versions", "1")
        assert report["status"] == "nothing-to-do" and report["pruned"]["versions"] == [], (report, stderr)
        report, stderr = rebuild_out(out, "--keep-versions", "2")  # a publish: v3 live, v2 (served) before it
        assert report["pruned"]["versions"] == [v1], (report, stderr)
        assert report["pruned"]["in_use"] == [] and search_text(server)["version"] in (v2, report["version"])
    finally:
        server.stop()
    # a clean stop lets go of the version too
    assert not leased(out / "versions" / v2)


def test_a_newer_version_a_server_serves_survives_a_rollback_of_current(indexed, tmp_path, tiny_bert_dir):
    """CURRENT set back by hand to an older version the server refuses (another model): the version it still
    serves is newer than the live one, which a publish removes (CURRENT was set back from it). Kept while served."""
    data, template = indexed
    out = tmp_path / "out"
    shutil.copytree(template, out, ignore=shutil.ignore_patterns(".lock"))
    v1 = current(out)
    index(data, out, "--model", tiny_bert_dir, "--full")  # v2, of another model; v1 kept as the one before
    v2 = current(out)
    server = serve(out, tmp_path / "server.log")  # serves v2 (the tiny model)
    try:
        assert search_text(server)["version"] == v2
        (out / ".CURRENT.tmp-test").write_text(v1 + "\n")
        os.replace(out / ".CURRENT.tmp-test", out / "CURRENT")  # a rollback by hand
        refused = wait_for(lambda: server.client.get("/ready").json().get("refused"), "the refusal")
        assert (refused["version"], refused["reason"]) == (v1, "model"), refused
        # the cron line again (MiniLM, v1's model: nothing changed); its clean-up used to delete v2 under the server
        report, stderr = index(data, out, "--keep-versions", "1")
        assert report["status"] == "nothing-to-do" and current(out) == v1, report
        assert (out / "versions" / v2 / "manifest.json").is_file(), "the version served was removed"
        assert report["pruned"]["versions"] == [], (report, stderr)  # a run that publishes nothing removes none
        report, stderr = rebuild_out(out, "--keep-versions", "1")  # a publish over v1: v2 would go, were it not served
        assert (out / "versions" / v2 / "manifest.json").is_file(), "the version served was removed"
        assert report["pruned"]["in_use"] == [v2] and v2 not in report["pruned"]["versions"], (report, stderr)
        assert f"kept {v2} (newer than the live version {v1} that {report['version']} was published over)" in stderr
        after = search_text(server)
        assert after["version"] == v2 and all(hit["text"] for hit in after["results"][0]["hits"])
    finally:
        server.stop()
