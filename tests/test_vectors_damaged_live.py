"""petal index --vectors-column over a damaged live manifest says what a text run says: 78 naming the manifest and
the way out (``--full`` builds without reading it), and ``--full`` then publishes (real Parquet, real FAISS)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.layout import OutputDir


def _as_directory(manifest: Path) -> None:
    manifest.unlink()
    manifest.mkdir()


DAMAGE = {  # every way the live manifest can be unreadable (a run before said 78 without --full for some)
    "garbage": lambda m: m.write_text("{garbage"),
    "removed": lambda m: m.unlink(),
    "a directory": _as_directory,
    "no model key": lambda m: m.write_text(json.dumps({"format": 1})),
    "a key of another type": lambda m: m.write_text(json.dumps({**json.loads(m.read_text()), "embedding": [1]})),
    "not an object": lambda m: m.write_text("[]"),
}


def index(source: Path, out: Path, *flags: str):
    return CliRunner().invoke(cli, ["index", str(source), "--out", str(out), "--vectors-column", "emb", "-q", *flags])


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_live_manifest_is_78_with_the_way_out(tmp_path, damage):
    vectors = np.random.default_rng(0).standard_normal((6, 8))
    source = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": [f"a{i}" for i in range(6)],
                             "emb": pa.array([list(map(float, v)) for v in vectors], pa.list_(pa.float32()))}), source)
    out = tmp_path / "out"
    assert index(source, out).exit_code == 0
    live = OutputDir(out).current_version()
    DAMAGE[damage](out / "versions" / live / "manifest.json")
    result = index(source, out)
    assert result.exit_code == 78, result.output
    said = result.stderr.strip().splitlines()[-1]
    assert "manifest.json" in said and "--full" in said, said
    result = index(source, out, "--full")
    assert result.exit_code == 0, result.output
    assert OutputDir(out).current_version() != live
