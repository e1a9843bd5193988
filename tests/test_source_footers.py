"""A source's footer is read once per run, by preflight, and every later need of it (the ``--keep-columns`` types the
stored columns are written with, the rows of each row group a range plan cuts at) takes what preflight read
(``ShardInfo.schema``, ``ShardInfo.group_rows``). Only a shard the run did not name (a kept shard whose stored
columns must be written again) has its footer read again, through the sources' reader: closed after, an EIO retried
(counted) then 74 naming the shard. Before: ``store/columns.py`` opened every shard a second time with a bare
``ParquetFile`` (an object's handle never closed) and ``store/ranges.py`` did the same without a retry."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.parquet import ShardInfo, inspect_shard
from petal.pipeline.reliability import faults
from petal.pipeline.store.ranges import group_rows

PETAL = str(Path(sys.executable).parent / "petal")
ROW_READERS = {"_record_batches", "_locate"}  # pipeline/ingest/parquet.py: opens that read rows, not a footer


def shard(path: Path, prefix: str, rows: int = 30, group: int = 10) -> Path:
    pq.write_table(pa.table({"id": [f"{prefix}-{i}" for i in range(rows)],
                             "emb": pa.array([[float(i), 1.0] for i in range(rows)], pa.list_(pa.float32())),
                             "lang": [f"lang-{i % 3}" for i in range(rows)]}), path, row_group_size=group)
    return path


class FooterReads:
    """Counts, per file under ``root``, the opens by pyarrow's readers that are not a row reader's (the real
    functions run)."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root, self.count = str(root), Counter()
        for name in ("read_table", "read_schema", "read_metadata"):
            monkeypatch.setattr(pq, name, self.wrap(getattr(pq, name)))
        monkeypatch.setattr(pq.ParquetFile, "__init__", self.wrap(pq.ParquetFile.__init__, skip_self=True))

    def wrap(self, real, skip_self: bool = False):
        def spy(*args, **kwargs):
            source = args[1] if skip_self else (args[0] if args else kwargs.get("source"))
            if isinstance(source, (str, Path)) and str(source).startswith(self.root):
                caller = sys._getframe(1).f_code.co_name
                if caller not in ROW_READERS:
                    self.count[Path(source).name] += 1
            return real(*args, **kwargs)
        return spy


def test_a_run_reads_each_named_shards_footer_once(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    shard(data / "a.parquet", "a")
    shard(data / "b.parquet", "b")
    monkeypatch.delenv(faults.FAULT_ENV, raising=False)
    spy = FooterReads(data, monkeypatch)
    result = CliRunner().invoke(cli, ["index", str(data), "--out", str(tmp_path / "out"), "--vectors-column", "emb",
                                      "--keep-columns", "lang", "-q"])
    assert result.exit_code == 0, result.output
    assert spy.count == {"a.parquet": 1, "b.parquet": 1}, spy.count  # preflight's; before: 2 each


def test_row_groups_come_from_preflight_and_a_second_read_is_retried(tmp_path, monkeypatch):
    path = shard(tmp_path / "a.parquet", "a", rows=35, group=10)
    read = ReadConfig(text_column="lang", retry_delay_s=0.001)
    info = inspect_shard(path, read)
    assert info.group_rows == (10, 10, 10, 5)
    spy = FooterReads(tmp_path, monkeypatch)
    assert group_rows(info, read) == [10, 10, 10, 5] and spy.count == {}  # no second read
    bare = ShardInfo(path=path, abs_path=str(path), size=info.size, mtime_ns=info.mtime_ns, num_rows=35,
                     num_row_groups=4, has_id_column=True, id_type="string", text_type="string")
    assert group_rows(bare, read) == [10, 10, 10, 5] and spy.count == {"a.parquet": 1}
    monkeypatch.setattr(faults, "_ARMED", faults._Armed())
    monkeypatch.setenv(faults.FAULT_ENV, "read_footer:1+:eio")
    from petal.pipeline.reliability.errors import PetalIOError

    with pytest.raises(PetalIOError, match=r"a\.parquet: read error after 3 retries"):
        group_rows(bare, read)


def petal(tmp_path: Path, *args: str | Path, fault: str | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    env = {k: v for k, v in os.environ.items() if k != faults.FAULT_ENV}
    if fault:
        env[faults.FAULT_ENV] = fault
    report = tmp_path / "report.json"
    done = subprocess.run([PETAL, "index", *map(str, args), "-q", "--json-report", str(report)], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    return done, json.loads(report.read_text())


def test_a_kept_shards_footer_read_again_is_retried_then_74(tmp_path):
    """b.parquet is kept (not named) and its stored columns are gone: they are written again from its file, whose
    footer is read through the sources' reader (hit 1 of read_footer is a.parquet's preflight)."""
    a, b = shard(tmp_path / "a.parquet", "a"), shard(tmp_path / "b.parquet", "b")
    out = tmp_path / "out"
    done, _ = petal(tmp_path, a, b, "--out", out, "--vectors-column", "emb", "--keep-columns", "lang")
    assert done.returncode == 0, done.stderr

    # which side file is b's: the entry whose rows came from b.parquet
    sides = {json.loads(e.read_text())["source"]["path"]: e.parent for e in (out / "store").rglob("entry.json")}
    b_entry = next(path for name, path in sides.items() if name.endswith("b.parquet"))
    b_side = out / "store" / "columns" / b_entry.parent.name
    assert b_side.is_dir()
    pq.write_table(pa.table({"id": ["a-new"], "emb": pa.array([[0.5, 0.5]], pa.list_(pa.float32())),
                             "lang": ["x"]}), a)  # a changes: the run publishes
    shutil.rmtree(b_side)
    done, report = petal(tmp_path, a, "--out", out, "--vectors-column", "emb", "--keep-columns", "lang",
                         fault="read_footer:2+:eio")
    assert done.returncode == 74 and f"{b}: read error after 3 retries" in done.stderr, done.stderr
    assert report["retries"]["read"] == 0 and "recovered" not in done.stderr  # the retries all failed
    done, report = petal(tmp_path, a, "--out", out, "--vectors-column", "emb", "--keep-columns", "lang",
                         fault="read_footer:2:eio")
    assert done.returncode == 0 and report["retries"]["read"] == 1, done.stderr
    version = (out / "CURRENT").read_text().strip()
    ids = pq.read_table(out / "versions" / version / "ids.parquet")
    assert sorted(ids.column("lang").to_pylist()) == sorted(["x"] + [f"lang-{i % 3}" for i in range(30)])
