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
    with pytest.raises(TypeError, match=rf"^petal\.open_index\(\) got an unexpected keyword argument '{keyword}'$"):
        petal.open_index(out, **settings)
