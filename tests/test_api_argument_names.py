"""The Python API as a Python developer calls it: its errors name the keyword passed (``dim 0 < 1``, ``where:``), never
the CLI flag (``--dim``, ``--where``), which the CLI keeps naming; a wrong type is a ``TypeError`` (and still a
``petal.UsageError``, exit 2) naming the argument and what it takes; a torch tensor of vectors is searched as its
numpy array; ``repr`` says what an ``Index`` or ``Embedder`` is. Real packaged MiniLM, real FAISS, real Parquet."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

import petal
from petal.cli.main import cli

TEXTS = ["glaciers flow downhill", "bread rises with yeast", "the tide comes in twice a day"]
# a CLI flag in a message, save in a hint at a CLI command ("petal index --keep-columns")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-k)(?![\w-])")
CLI_HINT = re.compile(r"\bpetal [a-z]+ (?:\S+ )?\(?$")


def flags_named(message: str) -> list[str]:
    return [m.group() for m in FLAG.finditer(message) if not CLI_HINT.search(message, 0, m.start())]


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    path = tmp_path_factory.mktemp("names") / "docs.parquet"
    pq.write_table(pa.table({"id": [0, 1, 2], "text": TEXTS, "lang": ["en", "en", "fr"]}), path)
    return path


@pytest.fixture(scope="module")
def out(shard, minilm_dir):
    out = shard.parent / "out"
    petal.index(shard, out, quiet=True, keep_columns=["lang"])
    return out


@pytest.fixture(scope="module")
def index(out):
    with petal.open_index(out, device="cpu") as opened:
        yield opened


@pytest.fixture(scope="module")
def embedder(minilm_dir):
    with petal.Embedder(device="cpu") as opened:
        yield opened


def calls(shard, out, index):
    return {
        "index dim=0": (lambda: petal.index(shard, out.parent / "o", dim=0), "dim 0 < 1"),
        "index quantize": (lambda: petal.index(shard, out.parent / "o", quantize="int4"), "quantize 'int4'"),
        "index max_bad_rows": (lambda: petal.index(shard, out.parent / "o", max_bad_rows="x"), "max_bad_rows 'x'"),
        "index max_removed": (lambda: petal.index(shard, out.parent / "o", max_removed="x"), "max_removed 'x'"),
        "index index_memory": (lambda: petal.index(shard, out.parent / "o", index_memory="x"), "index_memory:"),
        "index metric": (lambda: petal.index(shard, out.parent / "o", metric="cos"), "metric 'cos'"),
        "index target_recall": (lambda: petal.index(shard, out.parent / "o", target_recall=2), "target_recall 2"),
        "index keep_columns": (lambda: petal.index(shard, out.parent / "o", keep_columns=[5]), "keep_columns [5]"),
        "index index_factory": (lambda: petal.index(shard, out.parent / "o", index_factory="Foo"),
                                "index_factory 'Foo'"),
        "rebuild target_recall": (lambda: petal.rebuild(out, target_recall=5), "target_recall 5"),
        "rebuild index_memory": (lambda: petal.rebuild(out, index_memory="0"), "index_memory 0 bytes"),
        "Embedder dim=0": (lambda: petal.Embedder(dim=0), "dim 0 < 1"),
        "open_index nprobe": (lambda: petal.open_index(out, nprobe=1 << 40), f"nprobe {1 << 40} >"),
        "search where column": (lambda: index.search("tides", where="nope = 1"), "where: unknown column 'nope'"),
        "search where syntax": (lambda: index.search("tides", where="(("), "where '(('"),
        "search_stored where": (lambda: index.search_stored(np.zeros(index.dim, np.float32), where="lang >"),
                                "where 'lang >'"),
        "check_where": (lambda: index.check_where("nope = 1"), "where: unknown column"),
    }


@pytest.mark.parametrize("name", list(calls(None, None, None)))
def test_api_errors_name_the_keyword_not_the_cli_flag(shard, out, index, name):
    call, named = calls(shard, out, index)[name]
    with pytest.raises(petal.UsageError) as caught:
        call()
    message = str(caught.value)
    assert named in message
    assert flags_named(message) == [], message
    if caught.value.report is not None:  # petal.index / rebuild: the report says it as the exception does
        assert caught.value.report.message == f"usage error: {message}" or caught.value.report.message == message


def test_the_json_report_of_an_api_run_names_the_keyword(shard, tmp_path):
    with pytest.raises(petal.UsageError):
        petal.index(shard, tmp_path / "o", dim=0, json_report=tmp_path / "r.json")
    assert "usage error: dim 0 < 1" in json.loads((tmp_path / "r.json").read_text())["message"]


def test_the_cli_keeps_naming_its_flags(shard, out, tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["index", str(shard), "--out", str(tmp_path / "o"), "--max-bad-rows", "x"])
    assert result.exit_code == 2 and "--max-bad-rows 'x'" in result.output, result.output
    result = runner.invoke(cli, ["query", str(out), "tides", "--where", "nope = 1"])
    assert result.exit_code == 2 and "--where: unknown column" in result.output, result.output


def test_a_torch_tensor_of_vectors_searches_as_its_numpy_array(index, embedder):
    vectors = embedder.encode(["tides"], query=True)
    expected = index.search(vectors, k=3)
    assert index.search(torch.from_numpy(vectors), k=3) == expected
    assert index.search(torch.from_numpy(vectors).requires_grad_(), k=3) == expected  # np.asarray refuses it
    assert index.search(torch.from_numpy(vectors[0]), k=3) == expected
    stored = index.query_vectors(vectors)
    assert index.search_stored(torch.from_numpy(stored), k=3) == index.search_stored(stored, k=3)
    half = [[h.id for h in hits] for hits in index.search_stored(torch.from_numpy(stored).to(torch.bfloat16), k=3)]
    assert half == [[h.id for h in hits] for hits in expected]


@pytest.mark.parametrize("call, named, takes", [
    (lambda ix, emb: emb.encode(torch.zeros(2, 3)), "texts", "iterable of"),
    (lambda ix, emb: emb.encode(np.zeros(3)), "texts", "iterable of"),
    (lambda ix, emb: emb.encode([["a"]]), "texts[0] is a list", "iterable of"),
    (lambda ix, emb: emb.encode(5), "texts", "list of them"),
    (lambda ix, emb: ix.search([np.zeros(384, np.float32)]), "queries[0] is a numpy.ndarray", "torch tensor"),
    (lambda ix, emb: ix.search(5), "queries", "torch tensor"),
    (lambda ix, emb: ix.search("tides", k="3"), "k '3'", "integer"),
    (lambda ix, emb: ix.search("tides", where=5), "where 5", "a str"),
    (lambda ix, emb: ix.search_stored("tides"), "vectors: a str", "Index.search"),
    (lambda ix, emb: ix.search_stored(["tides"]), "vectors: an array of <U5", "torch tensor"),
    (lambda ix, emb: ix.search_stored(None), "vectors: a NoneType", "numpy array"),
    (lambda ix, emb: ix.texts("doc"), "hits", "list of Hit"),
], ids=["encode tensor", "encode floats", "encode nested", "encode int", "search list of arrays", "search int",
        "search k str", "search where int", "search_stored str", "search_stored list of str", "search_stored None",
        "texts str"])
def test_a_wrong_type_is_a_type_error_naming_the_argument(index, embedder, call, named, takes):
    with pytest.raises(TypeError) as caught:
        call(index, embedder)
    assert isinstance(caught.value, petal.UsageError) and caught.value.exit_code == 2
    assert named in str(caught.value) and takes in str(caught.value), str(caught.value)


def test_keyword_types_are_type_errors(shard, tmp_path):
    for call in (lambda: petal.index(shard, tmp_path / "o", dim="8"), lambda: petal.open_index(tmp_path, nprobe="3"),
                 lambda: petal.Embedder(device=1), lambda: petal.rebuild(tmp_path, wait="no"),
                 lambda: petal.open_index(5)):
        with pytest.raises(TypeError):
            call()


def test_repr_says_what_it_is(out):
    index = petal.open_index(out, device="cpu")
    text = repr(index)
    assert text.startswith("<petal.Index ") and str(out) in text and "vectors=3" in text and "dim=384" in text
    assert "metric='ip'" in text and "all-MiniLM-L6-v2" in text
    index.close()
    assert repr(index) == f"<petal.Index {str(out)!r} (closed)>"
    embedder = petal.Embedder(device="cpu")
    text = repr(embedder)
    assert text.startswith("<petal.Embedder ") and "dim=384" in text and "device='cpu'" in text
    embedder.close()
    assert repr(embedder).endswith(" closed>")


@pytest.mark.parametrize("settings", [{"nprob": 3}, {"devic": "cpu"}, {"_caller": "x"}])
def test_a_keyword_typo_in_open_index_is_named_by_open_index(out, settings):
    """Was "Index.__init__() got an unexpected keyword argument 'nprob'" (or "got multiple values for '_caller'")."""
    keyword = next(iter(settings))
    with pytest.raises(TypeError, match=rf"^petal\.open_index\(\) got an unexpected keyword argument '{keyword}'"):
        petal.open_index(out, **settings)


@pytest.mark.parametrize(("command", "keywords", "said"), [
    ("index", {"bogus": 1}, "petal.index() got an unexpected keyword argument 'bogus'"),
    ("index", {"modle": "x"}, "petal.index() got an unexpected keyword argument 'modle'; did you mean 'model'?"),
    ("index", {"vector_column": "emb"}, "argument 'vector_column'; did you mean 'vectors_column'"),  # index's own
    ("index", {"out": None}, "petal.index() missing 1 required positional argument: 'out'"),  # None: leave out
    ("rebuild", {"index_factor": "Flat"}, "argument 'index_factor'; did you mean 'index_factory'"),
    ("rebuild", {"keep_version": 1}, "argument 'keep_version'; did you mean 'keep_versions'?"),
    ("rebuild", {"dim": 3}, "petal.rebuild() got an unexpected keyword argument 'dim'"),
])
def test_an_unknown_keyword_to_index_or_rebuild_is_a_usage_error_with_its_report(shard, tmp_path, command, keywords,
                                                                                   said):
    """Was a bare TypeError raised before the run: no ``.report``, no ``json_report`` file, and no ``PetalError``
    for the README's Airflow task (``except petal.PetalError``: not retried) to catch; ``dim="x"`` was already one."""
    report_file = tmp_path / "r.json"
    arguments = (shard, tmp_path / "o") if command == "index" else (tmp_path / "o",)
    if keywords.get("out", 1) is None:
        arguments, keywords = arguments[:1], {}
    with pytest.raises(petal.UsageError) as caught:
        getattr(petal, command)(*arguments, json_report=report_file, **keywords)
    assert isinstance(caught.value, TypeError) and caught.value.exit_code == 2
    assert said in str(caught.value), str(caught.value)
    assert caught.value.report is not None and caught.value.report.exit_code == 2
    written = json.loads(report_file.read_text())
    assert written["status"] == "failed" and written["exit_code"] == 2 and said in written["message"], written
    assert not (tmp_path / "o").exists()


def test_the_cli_refuses_an_unknown_flag_with_2_and_its_report(shard, tmp_path):
    report_file = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["index", str(shard), "--out", str(tmp_path / "o"), "--bogus",
                                      "--json-report", str(report_file)])
    assert result.exit_code == 2 and json.loads(report_file.read_text())["exit_code"] == 2


def test_every_entry_point_refuses_arguments_it_does_not_take_as_a_usage_error(out, index, embedder):
    """Python's own refusal (``Embedder.__init__() got an unexpected keyword argument 'devce'``) was a bare TypeError:
    now a ``petal.UsageError`` too (exit 2), named as the caller wrote the call, with the close matches."""
    vector = np.zeros((1, index.dim), np.float32)
    for call, said in [
        (lambda: petal.open_index(out, nprob=3), "petal.open_index() got an unexpected keyword argument 'nprob'; "
                                                 "did you mean 'nprobe'?"),
        (lambda: petal.open_index(), "petal.open_index() missing 1 required positional argument: 'path'"),
        (lambda: petal.Index(out, devce="cpu"), "petal.Index() got an unexpected keyword argument 'devce'; did you "
                                                "mean 'device'?"),
        (lambda: petal.verify(out, versio="v"), "petal.verify() got an unexpected keyword argument 'versio'; did you "
                                                "mean 'version'?"),
        (lambda: petal.versions(), "petal.versions() missing 1 required positional argument: 'out'"),
        (lambda: petal.rollback(out, versio="v"), "petal.rollback() got an unexpected keyword argument 'versio'; "
                                                  "did you mean 'version'?"),
        (lambda: petal.rollback(out, None, True), "petal.rollback() takes from 1 to 2 positional arguments but 3 "
                                                  "were given"),
        (lambda: petal.Embedder(devce="cpu"), "petal.Embedder() got an unexpected keyword argument 'devce'; did you "
                                              "mean 'device'?"),
        (lambda: embedder.encode(["a"], querry=True), "Embedder.encode() got an unexpected keyword argument "
                                                      "'querry'; did you mean 'query'?"),
        (lambda: index.search("tides", kk=3), "Index.search() got an unexpected keyword argument 'kk'; did you "
                                              "mean 'k'?"),
        (lambda: index.search(), "Index.search() missing 1 required positional argument: 'queries'"),
        (lambda: index.search_stored(vector, 3, None, 4), "Index.search_stored() takes from 2 to 4 positional "
                                                          "arguments but 5 were given"),
        (lambda: index.texts(hit=[]), "Index.texts() got an unexpected keyword argument 'hit'; did you mean 'hits'?"),
    ]:
        with pytest.raises(petal.UsageError) as caught:
            call()
        assert isinstance(caught.value, TypeError) and caught.value.exit_code == 2
        assert str(caught.value) == said
