"""Only a bad filter is the user's fault: ``petal serve``'s ``/search`` answered ANY ``ValueError`` raised by a search
422 (blaming the client), and ``petal.open_index(...).search(where=...)``/``petal query --where`` made any of them a
usage error (exit 2). A filter that does not parse, names a column not kept or compares a column with a literal of
another kind is a ``FilterError`` (a ``ValueError``): still 422 / exit 2 with the same messages; any other error of
a search is the server's 500 (logged) or goes up as it is (a bug: exit 1, never "usage error").

Real tiny BERT, real Parquet and FAISS, the CLI, the API and an in-process ``petal serve`` on loopback; the other
``ValueError`` is raised where a search builds its hits, on one reader only (no real search raises one today)."""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.index.filters import FilterError
from petal.pipeline.index.search import IndexReader

ROWS = 48
BUG = "a bug deep in the search, not the filter"
BAD_FILTERS = [  # (where, what the message says): parse, unknown column, literal of another kind, temporal literal
    ("topic = ", "expected a 'string' or a number"),
    ("colour = 'red'", "unknown column 'colour'"),
    ("topic = 5", "column 'topic' is string; 5 is an integer"),
    ("day = 'someday'", "column 'day' is date32"),
]


@pytest.fixture(scope="module")
def typed_index(tmp_path_factory: pytest.TempPathFactory, tiny_bert_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("filter-blame")
    pq.write_table(pa.table({
        "id": [f"d{i}" for i in range(ROWS)], "text": [f"document {i} about {i % 6}" for i in range(ROWS)],
        "topic": [str(i % 6) for i in range(ROWS)],
        "day": [datetime.date(2024, 1, 1 + i % 4) for i in range(ROWS)]}), root / "docs.parquet")
    out = root / "idx"
    result = CliRunner().invoke(cli, ["index", str(root / "docs.parquet"), "--out", str(out), "-q",
                                      "--model", str(tiny_bert_dir), "--keep-columns", "topic,day"])
    assert result.exit_code == 0, result.output
    return out


def _bug(*args, **kwargs):
    raise ValueError(BUG)


@pytest.mark.parametrize(("where", "said"), BAD_FILTERS, ids=[w for w, _ in BAD_FILTERS])
def test_every_bad_filter_is_a_filter_error_and_a_usage_error(typed_index, where, said):
    import petal
    from petal.pipeline.reliability.errors import UsageError

    reader = IndexReader(typed_index)
    query = reader.index.reconstruct_n(0, 1)
    with pytest.raises(FilterError, match=said):
        reader.search(query, 5, where=where)
    with petal.open_index(typed_index) as index:
        for call in (lambda: index.search_stored(query, 5, where=where), lambda: index.check_where(where)):
            with pytest.raises(UsageError, match=said):
                call()


def test_another_value_error_of_a_search_is_not_blamed_on_the_user(typed_index, monkeypatch):
    import petal
    from petal.pipeline.reliability.errors import PetalError

    with petal.open_index(typed_index) as index:
        query = index.reader.index.reconstruct_n(0, 1)
        assert len(index.search_stored(query, 3, where="topic = '1'")[0]) == 3
        monkeypatch.setattr(index.reader, "_hits", _bug)  # NOTE: this reader only
        for where in (None, "topic = '1'"):
            with pytest.raises(ValueError, match=BUG) as caught:
                index.search_stored(query, 3, where=where)
            assert not isinstance(caught.value, PetalError)  # before: UsageError (a usage error, exit 2)
        with pytest.raises(ValueError, match=BUG) as caught:
            index.search(["document about 1"], 3, where="topic = '1'")  # by text: the model embeds, then the bug
        assert not isinstance(caught.value, PetalError)


def test_petal_query_exits_2_for_a_bad_filter_and_1_for_a_bug(typed_index, monkeypatch):
    bad = CliRunner().invoke(cli, ["query", str(typed_index), "document", "--where", "topic = 5"])
    assert bad.exit_code == 2, bad.output
    assert "--where: column 'topic' is string; 5 is an integer" in bad.stderr and "Traceback" not in bad.output
    monkeypatch.setattr(IndexReader, "_hits", _bug)
    broken = CliRunner().invoke(cli, ["query", str(typed_index), "document", "--where", "topic = '1'"])
    assert broken.exit_code == 1, broken.output  # a bug (exit 1, its traceback), never "usage error" (2)
    assert isinstance(broken.exception, ValueError) and str(broken.exception) == BUG
    assert "usage error" not in broken.output.lower()


@pytest.fixture
def in_process_server(typed_index, tiny_bert_dir):
    """``petal serve``'s app on uvicorn in a thread of this process (so that one reader can be patched), on a
    loopback port; yields (base url, the served reader)."""
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from petal.engine.loader import inspect_model
    from petal.pipeline.jobs.query import QueryModel, SearchIndex, engine_config
    from petal.pipeline.serve.service import ServeState
    from petal.pipeline.serve.settings import ServeSettings
    from tests._serve_shared import served_in_process

    spec = inspect_model(tiny_bert_dir)
    index = SearchIndex.open(typed_index, spec)
    settings = ServeSettings(reload_interval_s=60.0)
    state = ServeState(QueryModel(spec, engine_config(spec, "cpu")), settings, index_root=typed_index, index=index)
    with served_in_process(state) as url:
        yield url, index.reader


def test_serve_answers_a_bad_filter_422_and_another_error_500(in_process_server, monkeypatch):
    import httpx

    url, reader = in_process_server
    vector = reader.index.reconstruct_n(0, 1)[0].tolist()
    with httpx.Client(base_url=url, timeout=60) as client:
        for where, said in BAD_FILTERS:
            for body in ({"query": "document", "where": where}, {"vectors": [vector], "where": where}):
                response = client.post("/search", json={**body, "k": 3})
                assert response.status_code == 422, response.text
                message = response.json()["error"]["message"]
                assert said in message and message.startswith("'where'"), message
        good = [{"query": "document", "k": 3}, {"vectors": [vector], "k": 3, "where": "topic = '1'"},
                {"query": "document", "k": 3, "where": "topic = '1'"}]
        for body in good:
            assert client.post("/search", json=body).status_code == 200
        monkeypatch.setattr(reader, "_hits", _bug)  # NOTE: the served reader only
        for body in good:
            response = client.post("/search", json=body)
            assert response.status_code == 500, response.text  # before: 422, the client blamed
            error = response.json()["error"]
            assert error["type"] == "server_error" and BUG in error["message"], error
        response = client.post("/search", json={"query": "document", "where": "topic = 5"})
        assert response.status_code == 422 and "5 is an integer" in response.text  # judged before any search
        monkeypatch.undo()
        assert all(client.post("/search", json=body).status_code == 200 for body in good)
        metrics = client.get("/metrics").text
        assert 'petal_requests_total{route="/search",status="500"} 3.0' in metrics
