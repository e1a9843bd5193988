"""``petal index --vectors-column COL --full`` in an additive run reads the shards the index keeps again from their
files, as a text run re-embeds them (README "What a run keeps and removes": ``--full`` re-embeds every shard of the
index, the kept ones from their files, 78 if one is gone). Before: a vectors run dropped them, and the removal guard
refused the run (65, "1 shards not named with --sync", though no --sync was given). Real ``petal index``
processes, real Parquet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

PETAL = str(Path(sys.executable).parent / "petal")


def petal_index(tmp_path: Path, *args: str | Path) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "report.json"
    done = subprocess.run([PETAL, "index", *map(str, args), "--vectors-column", "emb", "-q", "--json-report",
                           str(report)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    return done, json.loads(report.read_text())


def live_ids(out: Path) -> list:
    version = (out / "CURRENT").read_text().strip()
    return pq.read_table(out / "versions" / version / "ids.parquet", columns=["id"]).column("id").to_pylist()


def test_full_keeps_the_shards_an_additive_run_keeps(tmp_path):
    for name in ("a", "b"):
        pq.write_table(pa.table({"id": [f"{name}0", f"{name}1"],
                                 "emb": pa.array([[1.0, 0.0], [0.0, 1.0]], pa.list_(pa.float32()))}),
                       tmp_path / f"{name}.parquet")
    out = tmp_path / "out"
    done, _ = petal_index(tmp_path, tmp_path / "a.parquet", tmp_path / "b.parquet", "--out", out)
    assert done.returncode == 0, done.stderr
    done, report = petal_index(tmp_path, tmp_path / "a.parquet", "--out", out, "--full")
    assert done.returncode == 0, done.stderr
    assert live_ids(out) == ["a0", "a1", "b0", "b1"] and report["shards"]["embedded"] == 2
    (tmp_path / "b.parquet").unlink()
    done, report = petal_index(tmp_path, tmp_path / "a.parquet", "--out", out, "--full")
    assert done.returncode == 78 and f"{tmp_path / 'b.parquet'} (kept from an earlier run) is gone" in done.stderr
    assert live_ids(out) == ["a0", "a1", "b0", "b1"]
    done, report = petal_index(tmp_path, tmp_path / "a.parquet", "--out", out, "--full", "--sync",
                               "--max-removed", "50%")
    assert done.returncode == 0 and live_ids(out) == ["a0", "a1"], done.stderr
