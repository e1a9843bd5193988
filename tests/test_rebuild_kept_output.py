"""``petal rebuild OUT --index-factory F`` over a live version whose output format picks the index (``--quantize int8``
or ``binary``, ``--output-dtype float16``): a usage error (2) that says the format is the live version's, kept by the
rebuild. NOTE: it said "conflicts with --quantize int8", a flag petal rebuild does not take and the user did not give.
The CLI with the tests' fake engine (tests/fake_engine.py), real Parquet and FAISS.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_cli import FAKE_ENGINE_ENV, invoke
from tests.fake_engine import make_fake_model_dir


@pytest.mark.parametrize(("flags", "said"), [(["--quantize", "int8"], "--quantize int8"),
                                             (["--quantize", "binary"], "--quantize binary"),
                                             (["--output-dtype", "float16"], "--output-dtype float16")])
def test_a_factory_given_over_a_kept_output_format_names_the_live_version(tmp_path: Path, flags: list[str],
                                                                           said: str) -> None:
    env = {FAKE_ENGINE_ENV: str(tmp_path / "engine.log")}
    model = make_fake_model_dir(tmp_path / "model", dim=16)
    pq.write_table(pa.table({"id": list(range(300)), "text": [f"doc {i} of topic {i % 5}" for i in range(300)]}),
                   tmp_path / "a.parquet")
    out = tmp_path / "out"
    built = invoke(["index", str(tmp_path / "a.parquet"), "--out", str(out), "--model", str(model), "-q", *flags],
                   env=env)
    assert built.exit_code == 0, built.output
    result = invoke(["rebuild", str(out), "--index-factory", "HNSW8"], env=env)
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert f"conflicts with the live version's output ({said}; a rebuild keeps it)" in last, last
    assert "'HNSW8'" in last and "leave --index-factory auto" in last, last
    assert invoke(["rebuild", str(out), "--index-factory", "auto"], env=env).exit_code == 0
