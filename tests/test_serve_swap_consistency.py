"""``/metrics`` and ``/ready`` read while a version is swapped in (on the follower's reload thread) describe one
version: before, a scrape between a gauge's ``clear()`` and ``set()`` saw no ``petal_index_version`` at all, or the
new version beside the old ``petal_index_vectors``, and ``/ready`` read the live version more than once (one
version's name, the next one's vector count, a refusal of the version it serves).

Real components: ``petal index --vectors-column`` over real Parquet (two versions of different sizes), real FAISS
readers, the server's own ``ServeState``/``ServeMetrics`` and prometheus_client's rendering; the swap is the
follower's own assignment, done from a second thread as its reload thread does."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.test_serve_vectors_only import ROWS_PER_SHARD, write_shard

pytest.importorskip("prometheus_client")

ROUNDS = 3000


def _scrape(text: str) -> tuple[list[str], float]:
    versions = re.findall(r'^petal_index_version\{version="([^"]*)"\} 1\.0$', text, re.M)
    vectors = re.search(r"^petal_index_vectors (\S+)$", text, re.M)
    assert vectors is not None, text
    return versions, float(vectors.group(1))


@pytest.fixture
def fast_switches():
    """Python's thread switch interval at 1 us, so the two threads interleave at every few bytecodes."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def _flipping(flip) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()

    def run() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            flip(n)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return stop, thread


def test_metrics_scraped_during_swaps_name_one_version_and_its_vectors(fast_switches):
    from petal.pipeline.serve.metrics import ServeMetrics

    metrics = ServeMetrics()
    metrics.serving("v0", 0)
    stop, thread = _flipping(lambda n: metrics.serving(f"v{n}", n))
    bad = []
    try:
        for _ in range(ROUNDS):
            versions, vectors = _scrape(metrics.render().decode())
            if len(versions) != 1 or versions[0] != f"v{vectors:.0f}":
                bad.append((versions, vectors))
    finally:
        stop.set()
        thread.join(60)
    assert not bad, f"{len(bad)} of {ROUNDS} scrapes mixed or lacked versions: {bad[:5]}"


def _two_versions(tmp_path: Path) -> tuple[Any, Any, Any]:
    """Two published versions of an index of vectors (the second 50 vectors more), opened, and a server's state
    serving the first: ``(state, first, second)``."""
    from petal.cli.main import cli  # noqa: F401  (the CLI's imports, as a server has them)
    from petal.pipeline.index.search import IndexReader
    from petal.pipeline.jobs.query import SearchIndex
    from petal.pipeline.serve.service import ServeState
    from petal.pipeline.serve.settings import ServeSettings
    from tests.test_serve import cli_run

    data = tmp_path / "data"
    data.mkdir()
    write_shard(data / "a.parquet", 0, ROWS_PER_SHARD, seed=1)
    out = tmp_path / "out"
    readers = []
    for extra in (0, 1):
        if extra:
            write_shard(data / "b.parquet", ROWS_PER_SHARD, 50, seed=2)
        cli_run("index", data, "--out", out, "-q", "--vectors-column", "emb", "--index-factory", "Flat")
        readers.append(IndexReader(out))
    first, second = (SearchIndex.from_reader(reader, None) for reader in readers)
    return ServeState(None, ServeSettings(reload_interval_s=60.0), index_root=out, index=first), first, second


def test_ready_during_swaps_names_one_version_and_its_vectors(tmp_path: Path, fast_switches):
    state, first, second = _two_versions(tmp_path)
    assert (first.reader.ntotal, second.reader.ntotal) == (ROWS_PER_SHARD, ROWS_PER_SHARD + 50)
    follower = state.follower
    assert follower is not None
    expected = {first.version: first.reader.ntotal, second.version: second.reader.ntotal}

    def swap(n: int) -> None:
        follower.live = second if n % 2 else first

    stop, thread = _flipping(swap)
    bad = []
    try:
        for _ in range(ROUNDS):
            ready = state.ready()
            if expected.get(ready["version"]) != ready["vectors"]:
                bad.append((ready["version"], ready["vectors"]))
    finally:
        stop.set()
        thread.join(60)
        state.executor.shutdown()
    assert not bad, f"{len(bad)} of {ROUNDS} /ready answers mixed two versions: {bad[:5]}"


def test_metrics_during_swaps_name_one_version_for_the_index_and_its_search_copy(tmp_path: Path, fast_switches):
    """A swap sets the live version, then its gauges (follower.py); /metrics sets petal_search_copy from the live
    version and renders: a scrape between the two steps named one version in petal_index_version and the other in
    petal_search_copy (3 in 10,000 scrapes of a real server whose CURRENT flipped every 30 ms)."""
    state, first, second = _two_versions(tmp_path)
    follower = state.follower
    assert follower is not None

    def swap(n: int) -> None:  # as the follower swaps: the live version, then its gauges
        follower.swap_to(second if n % 2 else first)

    stop, thread = _flipping(swap)
    bad = []
    try:
        for _ in range(ROUNDS):
            text = state.metrics_body().decode()
            served, _ = _scrape(text)
            searched = re.findall(r'^petal_search_copy\{[^}]*version="([^"]*)"[^}]*\} 1\.0$', text, re.M)
            if len(served) != 1 or searched != served:
                bad.append((served, searched))
    finally:
        stop.set()
        thread.join(60)
        state.executor.shutdown()
    assert not bad, f"{len(bad)} of {ROUNDS} scrapes named two versions: {bad[:5]}"
