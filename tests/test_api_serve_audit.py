"""The public API (``petal.index``, ``petal.rebuild``, ``petal.open_index(...)``) and ``petal serve`` given what a
user gets wrong: each mistake is a clear ``PetalError`` (or a 4xx naming the field), never an ``AttributeError`` or
``TypeError`` from inside, nor Python's own message. Real components: a Parquet shard of a few rows indexed by
``petal.index`` with the packaged MiniLM (one kept column), real FAISS, a real ``petal serve`` on a loopback port."""

from __future__ import annotations

import json

import numpy as np
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


def test_embedder_refuses_an_engine_factory_that_is_not_callable():
    """``petal.Embedder(engine_factory=3)`` loaded the model's files, then raised ``TypeError: 'int' object is not
    callable``."""
    with pytest.raises(petal.UsageError, match=r"petal\.Embedder\(\): engine_factory=3 is an int, not callable"):
        petal.Embedder(engine_factory=3)


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


def test_an_integer_too_long_for_python_in_where_is_named_by_the_api(built):
    """A literal of 5000 digits raised Python's own ``ValueError`` ("Exceeds the limit (4300 digits) for integer
    string conversion ...; use sys.set_int_max_str_digits()"), which named neither ``--where`` nor the number."""
    _, out = built
    with petal.open_index(out) as index:
        for search in (lambda w: index.search("glaciers", k=2, where=w),
                       lambda w: index.search_stored(np.full((1, DIM), 0.05, np.float32), k=2, where=w),
                       index.check_where):
            with pytest.raises(petal.UsageError, match=r"^where .*: the number 9{12}\.\.\. has 5000 digits") as caught:
                search(f"year = {HUGE}")
            assert "set_int_max_str_digits" not in str(caught.value)
            assert len(str(caught.value)) < 300
        assert [h.fields["year"] for h in index.search("glaciers", k=6, where="year = 2020")[0]] == [2020, 2020]


# --- petal serve --------------------------------------------------------------------------------------------------


def test_serve_names_where_for_an_integer_too_long_for_python(server):
    """The same literal on ``/search``: a 422 whose message did not name ``'where'`` (it was Python's own,
    pointing at ``sys.set_int_max_str_digits``). The server keeps serving."""
    c = server.client
    for body in ({"query": "glaciers", "where": f"year = {HUGE}"},
                 {"vectors": [[0.05] * DIM], "where": f"year IN (2020, {HUGE})"}):
        response = c.post("/search", json=body)
        assert response.status_code == 422, response.text
        message = response.json()["error"]["message"]
        assert message.startswith("'where' ") and "has 5000 digits" in message, message
        assert "set_int_max_str_digits" not in message
        assert c.get("/health").status_code == 200
    found = c.post("/search", json={"query": "glaciers", "k": 6, "where": "year = 2020"}).json()
    assert [hit["fields"]["year"] for hit in found["results"][0]["hits"]] == [2020, 2020]


def texts_embedded(client) -> float:
    """``petal_batch_texts_count``: how many engine steps the server ran (from ``/metrics``)."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("petal_batch_texts_count"):
            return float(line.split()[-1])
    raise AssertionError("no petal_batch_texts_count in /metrics")


@pytest.mark.parametrize("where", ["year = 'x'", "nope = 1", "year = ", f"year = {HUGE}", "year IN (2020, 'a')"])
def test_serve_refuses_a_bad_where_before_embedding_the_query(server, where):
    """A text search with a bad ``where`` is 422 before its texts are embedded (it ran an engine step first, then
    answered 422 from the search). A good ``where`` still embeds and searches."""
    c = server.client
    before = texts_embedded(c)
    response = c.post("/search", json={"queries": ["glaciers", "tides"], "where": where})
    assert response.status_code == 422 and response.json()["error"]["message"].startswith("'where'"), response.text
    assert texts_embedded(c) == before  # no engine step ran for it
    found = c.post("/search", json={"query": "glaciers", "k": 6, "where": "year = 2021"})
    assert found.status_code == 200 and texts_embedded(c) == before + 1, found.text


GAPS = [  # (route, JSON body, status, in the message): mistakes no other serve test sends
    ("/v1/embeddings", {"input": "x", "dimensions": 0}, 422, "'dimensions' must be >= 1, got 0"),
    ("/v1/embeddings", {"input": "x", "dimensions": -3}, 422, "'dimensions' must be >= 1, got -3"),
    ("/v1/embeddings", {"input": "x", "dimensions": 385}, 422, "'dimensions' is 385, the model has 384"),
    ("/v1/embeddings", {"input": "x", "dimensions": True}, 422, "'dimensions' must be an integer, not a boolean"),
    ("/v1/embeddings", {"input": "x", "dimensions": "12"}, 422, "'dimensions' must be an integer, not a string"),
    ("/v1/embeddings", {"input": "x", "dimensions": 384.0}, 422, "'dimensions' must be an integer, not 384.0"),
    ("/v1/embeddings", {"input": "x", "truncate": 1}, 422, "'truncate' must be true or false"),
    ("/v1/embeddings", {"input": "x", "input_type": "passage"}, 422, "'input_type' must be one of query, document"),
    ("/v1/embeddings", {"input": [-1, 5]}, 422, "token id -1 is outside the vocabulary (0..30521)"),
    ("/v1/embeddings", {"input": [[101, 102], [30522]]}, 422, "input item 1: token id 30522 is outside"),
    ("/v1/embeddings", {"input": [[True]]}, 422, "'input' item 0 position 0 is a boolean, not a token id"),
    ("/v1/embeddings", {"input": [[101], []]}, 422, "'input' item 1 is an empty list of token ids"),
    ("/v1/embeddings", {"input": [[101], "x"]}, 422, "'input' item 1 is a string, not a list of token ids"),
    ("/v1/embeddings", {"input": []}, 422, "'input' is empty"),
    ("/v1/embeddings", {"input": [101] * 300}, 413, "input item 0 has more than 256 tokens"),
    ("/v1/embeddings", {"input": "x", "foo": None}, 422, "unknown field(s) 'foo'"),
    ("/search", {"query": "x", "k": True}, 422, "'k' must be an integer, not a boolean"),
    ("/search", {"query": "x", "k": "3"}, 422, "'k' must be an integer, not a string"),
    ("/search", {"query": "x", "k": -1}, 422, "'k' must be >= 1, got -1"),
    ("/search", {"query": "x", "k": 51}, 422, "'k' is 51, over the limit of 50 (--max-k)"),
    ("/search", {"query": ["x"]}, 422, "'query' must be a string (use 'queries' for a list)"),
    ("/search", {"queries": []}, 422, "'queries' is empty"),
    # NOTE: 'queries' takes a list only (a bare string is refused): the item's message says so too
    ("/search", {"queries": [["x"]]}, 422, "'queries' must be a list of strings: item 0 is an array"),
    ("/search", {"queries": ["ice", 5]}, 422, "'queries' must be a list of strings: item 1 is an integer"),
    ("/search", {"queries": "ice"}, 422, "'queries' must be a list of strings"),
    ("/search", {"vectors": []}, 422, "'vectors' is empty"),
    ("/search", {"vectors": [0.05] * DIM}, 422, "lists of numbers: row 0 is 0.05 (one vector is sent as [[...]])"),
    ("/search", {"vectors": [[True] * DIM]}, 422, "lists of numbers: row 0 position 0 is a boolean"),
    ("/search", {"vectors": [["0.05"] * DIM]}, 422, "lists of numbers: row 0 position 0 is a string"),
    ("/search", {"vectors": [[0.05] * (DIM + 1)]}, 422, "'vectors' rows must have 384 values"),
    ("/search", {"query": "x", "include": "text"}, 422, "'include' must be a list of 'text', 'metadata'"),
    ("/search", {"query": "x", "where": 5}, 422, "'where' must be a filter expression"),
    ("/search", {"query": "x", "where": "year = '2020'"}, 422, "column 'year' is int64"),
]


def test_serve_answers_each_mistake_with_its_4xx_and_keeps_serving(server):
    c = server.client
    for route, body, status, text in GAPS:
        response = c.post(route, json=body)
        assert response.status_code == status, (body, response.text)
        assert text in response.json()["error"]["message"], (body, response.text)
    for method, route in (("GET", "/search"), ("GET", "/v1/embeddings"), ("HEAD", "/search")):
        assert c.request(method, route).status_code == 405
    assert c.head("/health").status_code == 200
    assert c.get("/health").json() == {"status": "ok"}
    assert c.post("/v1/embeddings", json={"input": "x", "dimensions": 8}).json()["data"][0]["embedding"].__len__() == 8
    assert "Traceback" not in server.log.read_text(errors="replace")
