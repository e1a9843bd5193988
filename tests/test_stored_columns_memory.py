"""Bounded memory (RELIABILITY.md promise 9) where petal writes the text and ``--keep-columns`` it stores
(``OUT/store/columns/...``, the version's ``ids.parquet``): large values (100 KB documents, 20 KB kept cells) are
written in pages of ~1 MB and read in record batches bounded by bytes, so the Arrow memory a run holds stays a few
record batches' worth (``ReadConfig.max_batch_bytes``), whatever the shard's rows.

Measured by the Arrow pool's own peak (``max_memory``, what Arrow allocated at once; not RSS, which the allocator's
retention blurs) in a fresh interpreter per run: before, Parquet's writer put 1024 values in a page before it
checked the page's size (1024 texts of 100 KB: one ~100 MB page, encoded and compressed in several copies), and a
side file's kept column was read 8192 rows at a time whatever its bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_engine import make_fake_model_dir

MB = 1 << 20
REPO = Path(__file__).resolve().parents[1]

RUN = """
import json, sys
from pathlib import Path
import pyarrow as pa
import pyarrow.parquet as pq
import petal
from tests.fake_engine import fake_engine_factory
data, out, model, keep = sys.argv[1:5]
petal.index([data], out=out, model=model, quiet=True, engine_factory=fake_engine_factory(None),
            keep_columns=[keep] if keep else None)
print(json.dumps({"peak": pa.default_memory_pool().max_memory()}))
"""


def arrow_peak(data: Path, out: Path, model: Path, keep: str = "") -> int:
    """Peak Arrow memory of ``petal.index(data)`` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", RUN, str(data), str(out), str(model), keep], cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout.strip().splitlines()[-1])["peak"])


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def write_source(path: Path, table: pa.Table) -> None:
    # small pages in the source, as most writers make them: only petal's own pages are measured
    path.parent.mkdir(parents=True)
    pq.write_table(table, path, write_batch_size=16)


def test_long_documents_are_stored_without_holding_them_many_times(tmp_path, model):
    rows = 640  # ~64 MB of text: one record batch (max_batch_bytes)
    texts = [(f"doc{i} " + "alpha beta gamma " * 6000)[:100_000] for i in range(rows)]
    write_source(tmp_path / "data" / "a.parquet", pa.table({"id": [f"d{i}" for i in range(rows)], "text": texts}))
    peak = arrow_peak(tmp_path / "data", tmp_path / "out", model)
    text_bytes = rows * 100_000
    assert peak < 3.5 * text_bytes, f"Arrow held {peak / MB:.0f} MB for {text_bytes / MB:.0f} MB of text"
    stored = pq.ParquetFile(next((tmp_path / "out" / "store" / "columns").rglob("*.parquet")))
    assert stored.read(columns=["text"]).column("text").to_pylist() == texts  # the same text, stored


def test_a_large_kept_column_is_stored_without_holding_it_many_times(tmp_path, model):
    rows = 640  # 100 KB kept cells beside short texts: ~64 MB, one record batch now sized by both columns
    cells = [(f"{i} " + "z" * 100_000)[:100_000] for i in range(rows)]
    write_source(tmp_path / "data" / "a.parquet", pa.table({"id": [f"d{i}" for i in range(rows)],
                                                            "text": [f"short text {i}" for i in range(rows)],
                                                            "big": cells}))
    peak = arrow_peak(tmp_path / "data", tmp_path / "out", model, keep="big")
    kept_bytes = rows * 100_000
    assert peak < 3.5 * kept_bytes, f"Arrow held {peak / MB:.0f} MB for {kept_bytes / MB:.0f} MB of kept cells"
    ids = pq.read_table(next((tmp_path / "out" / "versions").glob("v*")) / "ids.parquet", columns=["id", "big"])
    assert sorted(zip(ids.column("id").to_pylist(), ids.column("big").to_pylist())) == \
        sorted((f"d{i}", cell) for i, cell in enumerate(cells))
