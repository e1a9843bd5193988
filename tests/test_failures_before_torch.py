"""A text `petal index` or a one-shot `petal embed` that fails on its input, its output directory or the
model's files does so before it imports torch (issue 14, item 2: each command imports the heavy libraries only
when it needs them): the engine is imported where the run loads its model, not when the run starts."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_lazy_imports import run


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lazy_index")
    pq.write_table(pa.table({"id": [1, 2], "text": ["glaciers flow downhill", "bread needs yeast"]}),
                   root / "ok.parquet")
    pq.write_table(pa.table({"id": [1, 2], "body": ["a", "b"]}), root / "nocol.parquet")
    (root / "bad.parquet").write_bytes(b"not parquet")
    (root / "no_config").mkdir()
    (root / "a_file").write_text("x")
    return root


CASES = [
    (["missing.parquet"], [], 66, "missing source"),
    (["bad.parquet"], [], 65, "not Parquet"),
    (["nocol.parquet"], [], 65, "no text column"),
    (["ok.parquet"], ["--keep-columns", "nope"], 65, "kept column missing"),
    (["ok.parquet"], ["--delete", "missing.parquet"], 66, "delete list missing"),
    (["ok.parquet"], ["--model", "no_config"], 78, "model dir without config.json"),
    (["ok.parquet"], ["--model", "missing_model"], 78, "model dir missing"),
]


@pytest.mark.parametrize(("sources", "flags", "code"), [c[:3] for c in CASES], ids=[c[3] for c in CASES])
def test_an_index_run_that_fails_before_its_model_loads_never_imports_torch(data, tmp_path, sources, flags, code):
    argv = ["index", *[str(data / s) for s in sources], "--out", str(tmp_path / "out"), "-q",
            *[str(data / f) if f.endswith((".parquet", "config", "_model")) else f for f in flags]]
    got, loaded = run(argv, tmp_path)
    assert got == code, argv
    assert "torch" not in loaded, f"petal {' '.join(argv)} imported torch"


def test_an_output_directory_under_a_file_fails_without_torch(data, tmp_path):
    got, loaded = run(["index", str(data / "ok.parquet"), "--out", str(data / "a_file" / "out"), "-q"], tmp_path)
    assert got == 73
    assert "torch" not in loaded


@pytest.mark.parametrize(("flags", "code"), [(["--model", "missing_model"], 78), (["--model", "no_config"], 78),
                                             (["--input", "nocol.parquet"], 65)],
                         ids=["model dir missing", "model dir without config.json", "input without its column"])
def test_a_one_shot_embed_that_fails_on_its_model_or_input_never_imports_torch(data, tmp_path, flags, code):
    argv = ["embed", *[str(data / f) if f.endswith((".parquet", "config", "_model")) else f for f in flags]]
    if "--input" not in flags:
        argv.append("a query")
    got, loaded = run(argv, tmp_path)
    assert got == code, argv
    assert "torch" not in loaded, f"petal {' '.join(argv)} imported torch"
