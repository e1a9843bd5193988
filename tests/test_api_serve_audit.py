"""The public API (``petal.index``, ``petal.rebuild``, ``petal.open_index(...)``) and ``petal serve`` given what a
user gets wrong: each mistake is a clear ``PetalError`` (or a 4xx naming the field), never an ``AttributeError`` or
``TypeError`` from inside, nor Python's own message. Real components: a Parquet shard of a few rows indexed by
``petal.index`` with the packaged MiniLM (one kept column), real FAISS, a real ``petal serve`` on a loopback port."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

DIM = 384
TEXTS = ["Glaciers carve valleys over thousands of years.", "Sourdough needs a lively starter.",
         "A heron waits motionless in the shallows.", "Compilers turn source code into machine code.",
         "Tides follow the pull of the moon.", "Espresso is brewed under pressure."]
HUGE = "9" * 5000  # an integer literal of more digits than Python's int() converts (4300)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """OUT of ``petal.index`` on one shard of six rows (id, text, year kept), the packaged model."""
    root = tmp_path_factory.mktemp("api-serve-audit")
    (root / "data").mkdir()
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(len(TEXTS))], "text": TEXTS,
                             "year": [2019 + i % 3 for i in range(len(TEXTS))]}), root / "data" / "s.parquet")
    out = root / "out"
    petal.index([root / "data"], out, keep_columns=["year"], quiet=True)
    return root, out


@pytest.fixture(scope="module")
def server(built):
    from tests.test_serve import Server

    root, out = built
    server = Server(root / "server.log", out, "--max-k", "50")
    yield server
    server.stop()


# --- the Python API ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("hook", "value"), [("report", "report.json"), ("report", 5), ("stop", "SIGTERM"),
                                             ("engine_factory", 3)])
def test_index_refuses_a_hook_argument_of_the_wrong_type_naming_it(built, tmp_path, hook, value):
    """``report``, ``stop`` and ``engine_factory`` are keywords of ``petal.index``: a value of the wrong type was an
    ``AttributeError`` (``'str' object has no attribute 'finish'``, ``... 'check'``) or a ``TypeError`` (``'int'
    object is not callable``) from inside the run. Now a usage error (2) naming it, before any work, and the
    ``json_report`` asked for says so."""
    root, _ = built
    out, report = tmp_path / "out", tmp_path / "report.json"
    with pytest.raises(petal.UsageError, match=rf"petal\.index\(\): {hook}=") as caught:
        petal.index([root / "data"], out, json_report=report, quiet=True, **{hook: value})
    assert caught.value.exit_code == 2
    assert not out.exists()
    written = json.loads(report.read_text())
    assert written["exit_code"] == 2 and hook in written["message"]


@pytest.mark.parametrize(("hook", "value"), [("report", {}), ("stop", True)])
def test_rebuild_refuses_a_hook_argument_of_the_wrong_type_naming_it(built, hook, value):
    _, out = built
    before = (out / "CURRENT").read_text()
    with pytest.raises(petal.UsageError, match=rf"petal\.rebuild\(\): {hook}=") as caught:
        petal.rebuild(out, **{hook: value})
    assert caught.value.exit_code == 2
    assert (out / "CURRENT").read_text() == before


@pytest.mark.parametrize("where", [None, b"year = 2020", 2020, ["year = 2020"]])
def test_check_where_refuses_what_is_no_filter_text(built, where):
    """``Index.check_where`` is public: ``None``, bytes or a number went to the parser as they were (``TypeError:
    object of type 'NoneType' has no len()``, ``cannot use a string pattern on a bytes-like object``)."""
    _, out = built
    with petal.open_index(out) as index:
        with pytest.raises(petal.UsageError, match="not a filter expression"):
            index.check_where(where)
        index.check_where("year = 2020")  # the right type still checks


def test_reopened_with_a_where_of_the_wrong_type_does_not_refuse_the_new_version(built, tmp_path):
    """``Index.reopened(where=3)`` while ``CURRENT`` names a newer version: the ``TypeError`` of the filter parser
    marked that version as refused, so every later ``reopened()`` returned ``None`` (the old version searched on).
    Now a ``UsageError`` before the version is tried; it opens on the next call."""
    import shutil

    _, built_out = built
    out = shutil.copytree(built_out, tmp_path / "out", ignore=shutil.ignore_patterns(".lock"))
    with petal.open_index(out) as index:
        first = index.path.name
        petal.rebuild(out, metric="l2")  # no model: a new version from the stored embeddings
        with pytest.raises(petal.UsageError, match="not a filter expression"):
            index.reopened(where=3)
        fresh = index.reopened(where="year = 2020")
        assert fresh is not None and fresh.path.name != first
        assert fresh.manifest.metric == "l2"
        fresh.close()
