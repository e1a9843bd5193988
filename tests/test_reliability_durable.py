"""Durable writes (pipeline/reliability/durable.py) on a disk that refuses the bytes: the file keeps its old content
and no temp file stays beside it (RELIABILITY.md promises 2, 11). The refusal is the kernel's own: a child process
whose file size limit (RLIMIT_FSIZE) is below the write gets EFBIG, as a full disk gives ENOSPC."""

from __future__ import annotations

import errno
import os
import resource
import signal
from pathlib import Path

from petal.pipeline.reliability.durable import write_bytes_atomic
from tests import forkrun


def _write_past_the_limit(path: str) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # NOTE: else the kernel kills the process instead of failing write
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        write_bytes_atomic(Path(path), b"x" * 1_000_000)
    except OSError as exc:
        os._exit(0 if exc.errno == errno.EFBIG else 3)
    os._exit(4)  # the write went through: the test proves nothing


def test_a_write_that_fails_keeps_the_old_content_and_leaves_no_temp_file(tmp_path):
    report = tmp_path / "report.json"
    report.write_text('{"old": true}\n')
    rc, stderr = forkrun.call(_write_past_the_limit, (str(report),))
    assert rc == 0, stderr
    assert report.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # was also .report.json.tmp-PID
