"""A ``--vectors-column`` run that finds a damaged store entry for a named shard reads the shard again, as a text
run embeds it again, and says so in the report (``damaged_entries``: entry, shard, reason) and on the summary line.
Before, the vectors run read it again without a word in the report (only a warning on stderr)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.fake_cli import invoke
from tests.invariants import live


def test_a_damaged_entry_read_again_is_in_the_report(tmp_path: Path):
    shard = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": [1, 2], "emb": [[1.0, 0.0], [0.0, 1.0]]}), shard)
    out, report = tmp_path / "out", tmp_path / "report.json"
    args = ["index", str(shard), "--vectors-column", "emb", "--out", str(out), "-q"]
    assert invoke(args).exit_code == 0
    [vectors] = (out / "store").rglob("embeddings.npy")
    vectors.write_bytes(b"")
    result = invoke([*args, "--json-report", str(report)])
    assert result.exit_code == 0, result.output
    [damaged] = json.loads(report.read_text())["damaged_entries"]
    assert damaged["shard"] == str(shard) and damaged["reason"].startswith("embeddings.npy")
    assert Path(damaged["entry"]) == vectors.parent
    assert sorted(live(out)[0]) == [1, 2]
