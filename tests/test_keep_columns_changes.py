"""A run whose ``--keep-columns`` differ from the live version's says so (RELIABILITY 8, nothing silent).

Leaving the flag out keeps no column (README), so a cron job that forgot it published a version without them while
its summary read "0 added, 0 changed, 0 removed, 2 unchanged", no word on stderr: every ``--where`` on them exited
2 from then on. Now the run says which columns it drops (a warning, under ``-q`` too, with the flag that keeps them)
and adds (a note), once it publishes; the summary says ``kept columns changed: ...`` and the report records
``kept_column_changes``. A run with the same columns, a refused run and ``petal rebuild`` (it keeps the live
version's) say nothing of it. Text runs through the CLI (the fake engine), a ``--vectors-column`` run through the
Python API; real Parquet and FAISS.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.index.search import IndexReader
from petal.pipeline.layout import OutputDir
from tests.fake_cli import invoke
from tests.fake_engine import make_fake_model_dir

DIM = 8


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def write_shards(data: Path) -> None:
    data.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for s in "ab":
        vectors = rng.random((3, DIM), dtype=np.float32)
        pq.write_table(pa.table({"id": [f"{s}{i}" for i in range(3)], "text": [f"{s} pie {i}" for i in range(3)],
                                 "lang": ["en", "fr", "de"], "url": [f"u{s}{i}" for i in range(3)],
                                 "vec": pa.array(list(vectors), type=pa.list_(pa.float32(), DIM))}),
                       data / f"{s}.parquet")


class Runs:
    """``petal index DATA --out OUT -q`` with the fake engine; each run's report."""

    def __init__(self, root: Path, model: Path) -> None:
        self.root, self.model, self.count = root, model, 0
        self.data, self.out = root / "data", root / "out"
        write_shards(self.data)

    def index(self, *flags: str, sources: tuple[str, ...] = ()):
        self.count += 1
        report = self.root / f"report-{self.count}.json"
        result = invoke(["index", *(sources or (str(self.data),)), "--out", str(self.out), "--model",
                         str(self.model), "-q", "--json-report", str(report), *flags],
                        env={"PETAL_TEST_FAKE_ENGINE": str(self.root / "fake.jsonl")})
        return result, json.loads(report.read_text())


@pytest.fixture
def runs(tmp_path, fake_model) -> Runs:
    return Runs(tmp_path, fake_model)


@pytest.mark.parametrize("full", [False, True])
def test_a_rerun_without_the_flag_says_it_drops_the_kept_columns(runs, full):
    first, report = runs.index("--keep-columns", "lang")
    assert first.exit_code == 0 and report["kept_column_changes"] == {}, first.output
    assert "--keep-columns" not in first.stderr  # a first run changes nothing kept
    live = OutputDir(runs.out).current_version()
    result, report = runs.index(*(["--full"] if full else []))
    assert result.exit_code == 0 and report["status"] == "success", result.output
    assert (f"petal: warning: --keep-columns: the new version no longer keeps 'lang' (version {live} kept 'lang'; "
            "this run keeps no column): petal query --where on it exits 2 and hits no longer carry it; to keep it, "
            "pass --keep-columns lang on every run") in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "; kept columns changed: lang dropped;" in last, last  # was: '0 changed, 0 removed, 2 unchanged' only
    assert report["kept_column_changes"] == {"before": ["lang"], "after": [], "added": [], "dropped": ["lang"]}
    assert IndexReader(runs.out).kept_columns == []


def test_a_run_that_changes_the_kept_set_names_what_it_adds_and_drops(runs):
    assert runs.index("--keep-columns", "lang")[0].exit_code == 0
    swapped, report = runs.index("--keep-columns", "url")
    assert swapped.exit_code == 0, swapped.output
    assert "no longer keeps 'lang'" in swapped.stderr and "this run keeps 'url'" in swapped.stderr, swapped.stderr
    assert "pass --keep-columns lang,url on every run" in swapped.stderr, swapped.stderr
    assert "kept columns changed: url added; lang dropped" in swapped.stderr.strip().splitlines()[-1]
    assert report["kept_column_changes"] == {"before": ["lang"], "after": ["url"], "added": ["url"],
                                             "dropped": ["lang"]}
    grown, report = runs.index("--keep-columns", "url,lang")  # only added: a note, no warning
    assert grown.exit_code == 0, grown.output
    assert "petal: note: --keep-columns: the new version keeps 'lang' too (version" in grown.stderr, grown.stderr
    assert "warning" not in grown.stderr and "kept columns changed: lang added" in grown.stderr
    assert report["kept_column_changes"]["added"] == ["lang"] and report["kept_column_changes"]["dropped"] == []
    same, report = runs.index("--keep-columns", "url,lang")  # the same columns: nothing to say, nothing to do
    assert same.exit_code == 0 and report["status"] == "nothing-to-do", same.output
    assert "--keep-columns" not in same.stderr and "kept columns" not in same.stderr
    assert report["kept_column_changes"] == {}


def test_a_refused_run_says_no_column_change_and_rebuild_keeps_the_columns(runs):
    assert runs.index("--keep-columns", "lang")[0].exit_code == 0
    live = OutputDir(runs.out).current_version()
    # --sync over a: it would remove b's documents past the guard (65), and the kept columns with them
    refused, report = runs.index("--sync", sources=(str(runs.data / "a.parquet"),))
    assert refused.exit_code == 65, refused.output
    assert "no longer keeps" not in refused.stderr and "kept columns changed" not in refused.stderr, refused.stderr
    assert report["kept_column_changes"]["dropped"] == ["lang"]  # what it planned, as its shard_changes
    assert OutputDir(runs.out).current_version() == live
    rebuilt = invoke(["rebuild", str(runs.out), "--index-factory", "HNSW8", "--json-report",
                      str(runs.root / "rebuild.json")])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "--keep-columns" not in rebuilt.stderr
    assert json.loads((runs.root / "rebuild.json").read_text())["kept_column_changes"] == {}
    assert IndexReader(runs.out).kept_columns == ["lang"]


def test_the_api_and_a_vectors_run_say_it_too(tmp_path, caplog, capsys):
    data, out = tmp_path / "data", tmp_path / "out"
    write_shards(data)
    petal.index(data, out, vectors_column="vec", keep_columns=["lang", "url"], quiet=True)
    with caplog.at_level(logging.INFO, logger="petal"):
        report = petal.index(data, out, vectors_column="vec", keep_columns="url", quiet=True)
    assert report.status == "success" and report.kept_column_changes == {
        "before": ["lang", "url"], "after": ["url"], "added": [], "dropped": ["lang"]}
    said = [r for r in caplog.records if "--keep-columns" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING, caplog.records
    assert "pass --keep-columns lang,url on every run" in said[0].getMessage()
    assert "kept columns changed: lang dropped" in report.summary()
    assert "--keep-columns" not in capsys.readouterr().err  # quiet=True: the logger, not stderr
    assert IndexReader(out).kept_columns == ["url"]
