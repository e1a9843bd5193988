"""petal verify and petal info while a re-index publishes (issue 14, item 3): the version they check is leased as a
query's is, so a publish that prunes it (--keep-versions) leaves it on disk until the check ends. Without the lease,
a verify of the live version (minutes for a large one) that outlived a publish said the version was damaged: an I/O
error (74) or a missing file (78) about a sound index."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir
from tests import forkrun

ROWS, DIM = 300, 16


def _index(source: Path, out: Path) -> forkrun.Result:
    return forkrun.petal(["index", str(source), "--out", str(out), "-q", "--vectors-column", "emb", "--index-factory",
                          "Flat", "--keep-versions", "1", "--full"], timeout=300)


@pytest.mark.parametrize("command", [["verify"], ["verify", "--json"], ["info"], ["info", "--json"]])
def test_a_publish_that_prunes_the_version_under_a_check_leaves_it_until_the_check_ends(command, tmp_path):
    vectors = np.random.default_rng(0).standard_normal((ROWS, DIM), dtype=np.float32)
    pq.write_table(pa.table({"id": np.arange(ROWS), "emb": pa.FixedSizeListArray.from_arrays(
        pa.array(vectors.ravel()), DIM)}), tmp_path / "vectors.parquet")
    out = tmp_path / "out"
    assert _index(tmp_path / "vectors.parquet", out).rc == 0
    checked = OutputDir(out).current_version()
    trace = tmp_path / "trace"
    trace.touch()
    # NOTE: the check stops once it holds the version, its files not yet read; stopped (SIGSTOP) while a writer
    # publishes a new version and prunes every older one (--keep-versions 1)
    child = forkrun.start([command[0], str(out), *command[1:]],
                          env={"PETAL_FAULT": "query_open:1:sleep=5", "PETAL_FAULT_TRACE": str(trace)})
    deadline = time.monotonic() + 120
    while "query_open" not in trace.read_text():
        assert child.alive() and time.monotonic() < deadline, child.stderr_so_far()[-2000:]
        time.sleep(0.02)
    with child.paused():
        writer = _index(tmp_path / "vectors.parquet", out)
        assert writer.rc == 0, writer.stderr[-2000:]
        assert OutputDir(out).current_version() != checked
        assert "in use by a reader" in writer.stderr and (out / "versions" / checked).is_dir()
    result = child.wait(120)
    assert result.rc == 0, (result.rc, result.stderr[-2000:])
    assert checked in result.stdout
    # the lease ends with the check: the next publish removes the version
    assert _index(tmp_path / "vectors.parquet", out).rc == 0
    assert not (out / "versions" / checked).exists()
