"""``petal index``'s summary line breaks its skipped rows down by reason, as ``petal embed`` does.

Before: a run over null, blank and invalid UTF-8 texts ended with ``... 4 skipped, 0 truncated ...`` while ``petal
embed`` said ``4 skipped (empty_text 2, ...)`` (README: "Null and blank texts, one rule": count by reason and say
so on stderr). Real Parquet, the fake engine, the CLI's stderr."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from tests.fake_cli import FAKE_ENGINE_ENV, invoke
from tests.fake_engine import make_fake_model_dir


def test_the_summary_counts_skips_by_reason(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    texts = pa.array([b"glaciers move", None, b"", b"   ", b"\xff\xfe", b"cat sat"], pa.binary())
    pq.write_table(pa.table({"id": list(range(6)), "text": texts}), data / "a.parquet")
    result = invoke(["index", str(data), "--out", str(tmp_path / "out"), "--model",
                     str(make_fake_model_dir(tmp_path / "model"))], env={FAKE_ENGINE_ENV: str(tmp_path / "fake.log")})
    assert result.exit_code == 0, result.output
    last = result.stderr.splitlines()[-1]
    assert "2 rows embedded, 4 skipped (empty_text 2, invalid_utf8 1, null_text 1), 0 truncated" in last, last


def test_no_skips_stay_a_bare_zero(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": [1], "text": ["glaciers move"]}), data / "a.parquet")
    result = invoke(["index", str(data), "--out", str(tmp_path / "out"), "--model",
                     str(make_fake_model_dir(tmp_path / "model"))], env={FAKE_ENGINE_ENV: str(tmp_path / "fake.log")})
    assert result.exit_code == 0, result.output
    assert "1 rows embedded, 0 skipped, 0 truncated" in result.stderr.splitlines()[-1]
