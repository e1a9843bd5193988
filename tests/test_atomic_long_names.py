"""A file petal writes atomically (``durable.write_bytes_atomic``: ``--json-report``, ``CURRENT``, manifests, ...)
whose name the file system takes but which is within 12 bytes of its limit (NAME_MAX 255) is written: its temporary
file beside it is ``.petal-HASH.tmp-PID`` when ``.NAME.tmp-PID`` would be too long (``durable.temporary_beside``,
shared with ``petal embed --output``). Was: ENAMETOOLONG, and ``petal index --json-report NAME`` warned 'cannot write
the report ... File name too long' and wrote none."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from petal.pipeline.reliability.durable import temporary_beside, write_bytes_atomic
from tests.conftest import REPO


@pytest.mark.parametrize("size", [244, 250, 255])
def test_write_bytes_atomic_takes_a_name_near_the_limit(tmp_path, size):
    target = tmp_path / ("r" * (size - 5) + ".json")
    write_bytes_atomic(target, b"old\n")
    write_bytes_atomic(target, b"new\n")
    assert target.read_bytes() == b"new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]


def test_a_short_name_keeps_its_temporary_name(tmp_path):
    assert temporary_beside(tmp_path / "report.json").name == f".report.json.tmp-{os.getpid()}"


def test_index_json_report_with_a_name_near_the_limit_is_written(tmp_path, minilm_dir):
    name = "r" * 245 + ".json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "petal.cli.main", "index", str(REPO / "sample_data"), "--out", "idx",
                           "--model", str(minilm_dir), "-q", "--json-report", name], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "cannot write the report" not in proc.stderr
    assert json.loads((tmp_path / name).read_text())["exit_code"] == 0
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
