"""The Python API's documented promise: an argument or setting of the wrong type is a ``petal.UsageError`` naming it,
raised before any work (README "Python API"), never a ``TypeError``/``AttributeError`` from deep inside, nor a
value silently taken (``wait="no"`` waited)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, Path]:
    """A three-document index of the packaged model, and its shards directory."""
    root = tmp_path_factory.mktemp("audit")
    shards = root / "shards"
    shards.mkdir()
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["glaciers flow downhill", "espresso is coffee",
                                                             "cats purr on laps"]}), shards / "s.parquet")
    out = root / "idx"
    petal.index(shards, out, quiet=True)
    return out, shards


@pytest.fixture(scope="module")
def vectors_shard(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vectors") / "v.parquet"
    rows = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    pq.write_table(pa.table({"id": [str(i) for i in range(20)], "emb": list(rows)}), path)
    return path


@pytest.mark.parametrize(("settings", "named"), [
    ({"model": 5}, r"model=5 is an int"),
    ({"query_prompt": 5}, r"query_prompt=5 is an int"),
    ({"allow_pickle_weights": "yes"}, r"allow_pickle_weights='yes' is a str"),
    ({"device": 5}, r"device=5 is an int"),
    ({"device": "tpu"}, r"device='tpu' is not one of auto, cpu, cuda"),
    ({"dtype": "float99"}, r"dtype='float99' is not one of auto, float32"),
    ({"attention": None}, r"attention=None is a NoneType"),
])
def test_open_index_settings_are_judged_when_it_opens(small, settings, named):
    """``open_index``'s model settings were taken as given and judged at the first search by text, if at all:
    ``model=5`` was a TypeError from pathlib, ``query_prompt=5`` one from the tokenizer, ``allow_pickle_weights="yes"``
    allowed pickle weights, ``device=5`` waited for a search. Now a ``UsageError`` naming it, before the index opens
    (the CLI judges its flags when it parses them)."""
    out, _ = small
    with pytest.raises(petal.UsageError, match=named) as caught:
        petal.open_index(out, **settings)
    assert caught.value.exit_code == 2 and str(caught.value).startswith("petal.open_index(): ")
    # petal.Index is public and constructed directly too: it judged none of them (open_index did, before it)
    with pytest.raises(petal.UsageError, match=named) as caught:
        petal.Index(out, **settings)
    assert caught.value.exit_code == 2 and str(caught.value).startswith("petal.Index(): ")


def test_open_index_good_settings_still_search(small, minilm_dir):
    out, _ = small
    with petal.open_index(out, model=minilm_dir, device="cpu", dtype="float32", attention="auto",
                          query_prompt=None, allow_pickle_weights=False) as index:
        assert index.search("coffee", k=1)[0][0].id == "b"
    with pytest.raises(TypeError, match="'nope'"):  # an unknown keyword stays Python's TypeError naming it
        petal.open_index(out, nope=1)


def test_rebuild_wait_must_be_a_bool(small, tmp_path):
    """``petal.rebuild(out, wait="no")`` waited (a non-empty str is true); README names ``wait="no"`` among the
    settings that are a ``UsageError``. The report is written, as for every usage error."""
    out, _ = small
    report = tmp_path / "r.json"
    for wait in ("no", 0, None):
        with pytest.raises(petal.UsageError, match=rf"petal.rebuild\(\): wait={wait!r} is an? \w+, not bool"):
            petal.rebuild(out, wait=wait, json_report=report)
        assert json.loads(report.read_text())["exit_code"] == 2


@pytest.mark.parametrize("json_report", [5, b"/tmp/r.json", 1.5])
def test_json_report_of_the_wrong_type(small, tmp_path, json_report):
    """``json_report=5`` was a TypeError from pathlib (``petal.index`` and ``petal.rebuild`` alike)."""
    out, shards = small
    with pytest.raises(petal.UsageError, match="json_report") as caught:
        petal.index(shards, tmp_path / "o", json_report=json_report)
    assert caught.value.report.exit_code == 2 and not (tmp_path / "o").exists()
    with pytest.raises(petal.UsageError, match="json_report") as caught:
        petal.rebuild(out, json_report=json_report)
    assert caught.value.report.exit_code == 2


def test_vectors_column_must_be_a_str(vectors_shard, tmp_path):
    """``vectors_column=5`` (or ``b"emb"``) read the shard and said exit 65, "vectors column 5 is missing": a bad
    argument, not bad data."""
    for column in (5, b"emb", ["emb"]):
        with pytest.raises(petal.UsageError, match=r"vectors_column=.* is an? \w+, not str") as caught:
            petal.index(vectors_shard, tmp_path / "o", vectors_column=column)
        assert caught.value.exit_code == 2 and caught.value.report.exit_code == 2
    assert not (tmp_path / "o").exists()
    assert petal.index(vectors_shard, tmp_path / "o", quiet=True, vectors_column="emb").status == "success"


def test_an_empty_path_is_not_the_current_directory(small, tmp_path, monkeypatch):
    """``""`` (an unset variable) was ``Path("")``, the current directory: ``petal.index("", OUT)`` indexed every
    Parquet file under it (a virtualenv's test data included), ``petal.index(SRC, "")`` wrote ``CURRENT``,
    ``versions/`` and ``store/`` into it, ``open_index("")``/``rebuild("")`` opened or rebuilt an index there.
    Now a ``UsageError`` naming the argument, before any work (the CLI: exit 2)."""
    from click.testing import CliRunner

    from petal.cli.main import cli

    out, shards = small
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    pq.write_table(pa.table({"id": ["z"], "text": ["a stray shard in the working directory"]}), cwd / "stray.parquet")
    monkeypatch.chdir(cwd)
    for sources, target, named in (("", tmp_path / "o", "sources"), ([shards, ""], tmp_path / "o", "sources"),
                                   (shards, "", "out")):
        with pytest.raises(petal.UsageError, match=rf"^{named}: an empty path") as caught:
            petal.index(sources, target, quiet=True)
        assert caught.value.report.exit_code == 2
    assert sorted(p.name for p in cwd.iterdir()) == ["stray.parquet"] and not (tmp_path / "o").exists()
    petal.index(shards, cwd, quiet=True)  # an index in the working directory: still not what "" names
    for call, named in ((lambda: petal.open_index(""), "path"), (lambda: petal.Index(""), "path"),
                        (lambda: petal.rebuild(""), "out"), (lambda: petal.verify(""), "out"),
                        (lambda: petal.versions(""), "out"), (lambda: petal.rollback(""), "out")):
        with pytest.raises(petal.UsageError, match=rf"^{named}: an empty path"):
            call()
    result = CliRunner().invoke(cli, ["index", "", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "sources: an empty path" in result.output
    assert petal.open_index(".").num_vectors == 3 and petal.open_index(out).num_vectors == 3


def test_numpy_scalars_are_taken_as_their_python_values(vectors_shard, tmp_path):
    """A setting read from a numpy array (``np.True_``, ``np.float32(0.9)``) is the bool or float it holds:
    ``wait=np.True_`` was refused as 'is a bool, not bool' (numpy's bool is no ``bool``), ``target_recall=np.float32``
    as not a float; a value of the wrong kind is still refused, its type named with its package."""
    flags = np.array([True, False])
    out = tmp_path / "idx"
    petal.index(vectors_shard, out, vectors_column="emb", strict=flags[0], wait=flags[1],
                target_recall=np.float32(0.9), quiet=np.True_)
    with petal.open_index(out) as index:
        assert index.num_vectors == 20
    petal.rebuild(out, wait=np.False_, quiet=np.True_)
    with pytest.raises(petal.UsageError, match=r"strict=np\.int64\(1\) is a numpy\.int64, not bool"):
        petal.index(vectors_shard, tmp_path / "o2", vectors_column="emb", strict=np.int64(1))
    with pytest.raises(petal.UsageError, match=r"target_recall=np\.True_ is a numpy\.bool, not float"):
        petal.index(vectors_shard, tmp_path / "o3", vectors_column="emb", target_recall=np.True_)
