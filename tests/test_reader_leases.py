"""Every open index holds a lease on its version (``IndexReader``: a shared flock on the version's manifest), so a
re-index's pruning leaves the version a long-lived reader still reads: the Python API's ``Index`` and a
``petal query --stdin`` session, not only ``petal serve`` (tests/test_serve_leases.py). The lease goes with the
reader: a session that moved to the new version, or an ``Index`` that was dropped, lets the next run prune.

Real components: ``petal index`` child processes with the packaged MiniLM (forked from a preloaded interpreter:
tests/forkrun.py), a real ``petal query --stdin`` child."""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from tests import forkrun
from tests.pipes import Pipes
from tests.test_serve_leases import current, leased

TEXTS = ["glaciers flow downhill under their own weight", "a recipe for sourdough bread",
         "the tides follow the moon", "volcanoes erupt molten rock"]


def write_shard(data: Path, name: str, texts: list[str]) -> None:
    data.mkdir(exist_ok=True)
    pq.write_table(pa.table({"id": [f"{name}-{i}" for i in range(len(texts))], "text": texts}),
                   data / f"{name}.parquet")


def index(data: Path, out: Path, *args: object) -> tuple[dict, str]:
    report = out.parent / f"report-{time.monotonic_ns()}.json"
    run = forkrun.petal(["index", str(data), "--out", str(out), "-q", "--json-report", str(report), *map(str, args)],
                        timeout=600)
    assert run.rc == 0, run.stderr
    return json.loads(report.read_text()), run.stderr


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, minilm_dir) -> tuple[Path, Path]:
    """``(home, pristine)``: DATA (shard a) and OUT after its first ``petal index`` in ``home``, and a copy of ``home``
    right after it (one MiniLM run per module, not one per test)."""
    root = tmp_path_factory.mktemp("leases")
    home = root / "home"
    home.mkdir()
    write_shard(home / "data", "a", TEXTS)
    index(home / "data", home / "out")
    shutil.copytree(home, root / "pristine", symlinks=True)
    return home, root / "pristine"


@pytest.fixture
def two_versions(first_run):
    """The first run's copy put back in ``home``: the store records the shards' paths, so DATA stays where the first
    run read it (mtimes kept, so nothing looks changed)."""
    home, pristine = first_run
    shutil.rmtree(home)
    shutil.copytree(pristine, home, symlinks=True)
    return home / "data", home / "out"


def test_an_open_index_keeps_its_version_through_a_prune_and_lets_it_go_when_dropped(two_versions):
    data, out = two_versions
    first = out / "versions" / current(out)
    opened = petal.open_index(out)
    assert leased(first)
    write_shard(data, "b", ["a shard that changes the index"])
    report, stderr = index(data, out, "--keep-versions", "1")
    assert current(out) != first.name
    assert first.is_dir() and first.name in report["pruned"]["in_use"], (report["pruned"], stderr)
    assert first.name not in report["pruned"]["versions"] and first.name in stderr
    hits = opened.search("how do glaciers move", k=2)[0]  # the open version still answers, texts included
    assert hits[0].id == "a-0" and opened.texts(hits)[0] == TEXTS[0]

    del opened, hits
    gc.collect()
    assert not leased(first)
    write_shard(data, "c", ["one more shard"])
    report, _ = index(data, out, "--keep-versions", "1")
    assert not first.exists() and first.name in report["pruned"]["versions"] and report["pruned"]["in_use"] == []


def test_a_query_stdin_session_keeps_its_version_until_it_moves_on(two_versions):
    data, out = two_versions
    first = out / "versions" / current(out)
    session = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "query", str(out), "--stdin", "--json",
                                "-k", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    with Pipes(session) as pipes:
        assert session.stdin is not None
        session.stdin.write("how do glaciers move\n")
        session.stdin.flush()
        assert json.loads(pipes.line("the answer to 'how do glaciers move'"))["hits"][0]["id"] == "a-0"
        assert leased(first)
        write_shard(data, "b", ["a shard that changes the index"])
        report, _ = index(data, out, "--keep-versions", "1")
        assert first.is_dir() and first.name in report["pruned"]["in_use"], report["pruned"]

        session.stdin.write("what do volcanoes do\n")  # the session follows CURRENT: the next line moves it on
        session.stdin.flush()
        assert json.loads(pipes.line("the answer to 'what do volcanoes do'"))["hits"][0]["id"] == "a-3"
        deadline = time.monotonic() + 30
        while leased(first):
            assert time.monotonic() < deadline, "the session still holds the version it moved away from"
            time.sleep(0.05)
        write_shard(data, "c", ["one more shard"])
        report, _ = index(data, out, "--keep-versions", "1")
        assert not first.exists() and first.name in report["pruned"]["versions"]


def test_close_lets_the_version_go_and_a_closed_index_says_so(two_versions):
    _, out = two_versions
    first = out / "versions" / current(out)
    with petal.open_index(out) as opened:
        assert leased(first) and opened.search("glaciers", k=1)[0][0].id == "a-0"
    assert not leased(first)
    with pytest.raises(petal.UsageError, match="was closed"):
        opened.search("glaciers", k=1)
    opened.close()  # again: nothing


def test_petal_rebuild_keeps_a_version_in_use_and_reports_it(two_versions):
    data, out = two_versions
    first = out / "versions" / current(out)
    with petal.open_index(out):
        write_shard(data, "b", ["a shard that changes the index"])
        index(data, out)  # v2: v1 is the one before the live one, kept anyway
        report = out.parent / "rebuild.json"
        run = forkrun.petal(["rebuild", str(out), "--json-report", str(report)], timeout=600)
        assert run.rc == 0, run.stderr
        pruned = json.loads(report.read_text())["pruned"]
        assert first.is_dir() and pruned["in_use"] == [first.name] and first.name not in pruned["versions"], pruned
    run = forkrun.petal(["rebuild", str(out), "--json-report", str(report)], timeout=600)
    assert run.rc == 0, run.stderr
    assert not first.exists() and first.name in json.loads(report.read_text())["pruned"]["versions"]
