"""``--json-report`` never lands on a file of a petal output directory. Before: ``--json-report OUT/CURRENT``
replaced the pointer with the report (every later command: 78, 'CURRENT holds "{\\n  \\"command\\"..." which is not
a petal version id'), ``OUT/.lock`` swapped the writer lock's inode under its holder, ``OUT/store/tmp/r.json`` was
deleted by the next run's clean-up. Now ``petal index`` (text and ``--vectors-column``) and ``petal rebuild``
refuse such a path before any work (2, naming the flag), the refusal's report is not written there either (the
writer only warns); a report beside them (``OUT/report.json``) is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_cli import invoke
from tests.fake_engine import make_fake_model_dir

FAKE = "PETAL_TEST_FAKE_ENGINE"


@pytest.fixture
def setup(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["glaciers move", "rivers flow", "winds blow"],
                             "emb": pa.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], pa.list_(pa.float32()))}),
                   src / "a.parquet")
    return src, tmp_path / "out", make_fake_model_dir(tmp_path / "model")


def petal(tmp_path: Path, *args: str | Path):
    return invoke([*map(str, args)], env={FAKE: str(tmp_path / "fake.log")})


def index(tmp_path, src, out, model, *extra):
    with_model = [] if "--vectors-column" in extra else ["--model", model]  # no model for precomputed vectors
    return petal(tmp_path, "index", src, "--out", out, *with_model, "-q", *extra)


def snapshot(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
            and p.name != ".lock"}


@pytest.mark.parametrize("name", ["CURRENT", ".lock", ".last-version", "versions/r.json", "store/r.json",
                                  "store/tmp/r.json", "versions/VERSION/manifest.json"])
@pytest.mark.parametrize("vectors", [False, True], ids=["text", "vectors-column"])
def test_a_report_path_that_is_a_file_of_out_is_refused_before_any_work(tmp_path, setup, name, vectors):
    src, out, model = setup
    flags = ["--vectors-column", "emb"] if vectors else []
    assert index(tmp_path, src, out, model, *flags).exit_code == 0
    version = (out / "CURRENT").read_text().strip()
    report = out / name.replace("VERSION", version)
    before = snapshot(out)
    pq.write_table(pa.table({"id": [4], "text": ["snow falls"], "emb": pa.array([[2.0, 1.0]], pa.list_(pa.float32()))}),
                   src / "b.parquet")
    result = index(tmp_path, src, out, model, *flags, "--json-report", report)
    assert result.exit_code == 2, result.output
    assert "--json-report" in result.output and "is a file of the petal output directory" in result.output
    assert snapshot(out) == before  # nothing written, nothing embedded
    assert index(tmp_path, src, out, model, *flags).exit_code == 0  # the index is sound


def test_a_fresh_out_and_a_symlink_to_current_are_refused_too(tmp_path, setup):
    src, out, model = setup
    out.mkdir()  # there, empty: not an index yet
    result = index(tmp_path, src, out, model, "--json-report", out / "CURRENT")
    assert result.exit_code == 2, result.output
    assert not (out / "CURRENT").exists()
    assert index(tmp_path, src, out, model).exit_code == 0
    link = tmp_path / "report.json"
    os.symlink(out / "CURRENT", link)
    current = (out / "CURRENT").read_bytes()
    result = index(tmp_path, src, out, model, "--json-report", link)
    assert result.exit_code == 2, result.output
    assert (out / "CURRENT").read_bytes() == current


@pytest.mark.parametrize("name", ["CURRENT", ".lock", "store/tmp/r.json", "versions/VERSION/manifest.json"])
def test_rebuild_refuses_a_report_path_that_is_a_file_of_out_before_any_work(tmp_path, setup, name):
    """petal rebuild as petal index: 2 naming the flag, nothing rebuilt or written (it published a version, then
    only warned that the report was not written)."""
    src, out, model = setup
    assert index(tmp_path, src, out, model).exit_code == 0
    version = (out / "CURRENT").read_text().strip()
    before = snapshot(out)
    result = petal(tmp_path, "rebuild", out, "--index-factory", "HNSW8", "--json-report",
                   out / name.replace("VERSION", version))
    assert result.exit_code == 2, result.output
    assert "--json-report" in result.output and "is a file of the petal output directory" in result.output
    assert snapshot(out) == before
    assert petal(tmp_path, "rebuild", out, "--index-factory", "HNSW8").exit_code == 0
    assert index(tmp_path, src, out, model).exit_code == 0


def test_a_report_beside_the_index_files_is_written(tmp_path, setup):
    src, out, model = setup
    assert index(tmp_path, src, out, model).exit_code == 0
    result = index(tmp_path, src, out, model, "--json-report", out / "report.json")
    assert result.exit_code == 0, result.output
    assert json.loads((out / "report.json").read_text())["status"] == "nothing-to-do"
