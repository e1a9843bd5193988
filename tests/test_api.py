"""The Python API (``import petal``) against the CLI it is the base of: same vectors, same hits, same exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import petal
from petal.cli.common import float32_value
from petal.cli.main import cli
from tests.conftest import REPO, SAMPLE_DATA

QUERIES = ["how do glaciers move", "espresso and coffee"]


@pytest.fixture(scope="module")
def api_index(tmp_path_factory):
    out = tmp_path_factory.mktemp("api") / "idx"
    report = petal.index(SAMPLE_DATA, out, quiet=True, index_memory="1G", max_bad_rows="5%")
    return out, report


def test_import_petal_is_light():
    code = ("import sys, petal; assert petal.__version__; petal.PetalError; petal.UsageError; "
            "heavy = [m for m in ('torch', 'faiss', 'pyarrow', 'numpy', 'transformers') if m in sys.modules]; "
            "print(heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True,
                          timeout=300)
    assert done.stdout.strip() == "[]"
    assert set(petal.__all__) <= set(dir(petal))
    with pytest.raises(AttributeError):
        petal.no_such_thing  # noqa: B018


def test_index_returns_the_run_report(api_index):
    out, report = api_index
    assert isinstance(report, petal.RunReport) and report.status == "success" and report.exit_code == 0
    assert report.rows["embedded"] == 342 and report.shards == {"total": 3, "embedded": 3, "reused": 0}
    again = petal.index([str(p) for p in sorted(SAMPLE_DATA.glob("*.parquet"))], out, quiet=True, index_memory=1 << 30)
    assert again.status == "nothing-to-do" and again.shards["reused"] == 3


def test_embedder_encode_equals_petal_embed(tmp_path):
    texts = ["first text", "a second, longer text about glaciers", "third"]
    npy = tmp_path / "v.npy"
    assert CliRunner().invoke(cli, ["embed", *texts, "--output", str(npy)]).exit_code == 0
    embedder = petal.Embedder(device="cpu")
    vectors = embedder.encode(texts)
    assert vectors.dtype == np.float32 and vectors.shape == (3, embedder.dim) == (3, 384)
    np.testing.assert_array_equal(vectors, np.load(npy))
    # packed batches of any size give the same rows, in input order
    np.testing.assert_allclose(embedder.encode(texts, batch_tokens=embedder.max_length), vectors, atol=1e-5)
    assert embedder.encode("third").shape == (1, 384)
    query_npy = tmp_path / "q.npy"
    assert CliRunner().invoke(cli, ["embed", *texts, "--query", "--output", str(query_npy)]).exit_code == 0
    np.testing.assert_array_equal(embedder.encode(texts, query=True), np.load(query_npy))


def test_embedder_output_settings_equal_petal_embed(tmp_path, tiny_bert_dir):
    texts = ["first text", "second text", "third text"]
    for flags, settings in ((["--quantize", "binary", "--dim", "32"], {"quantize": "binary", "dim": 32}),
                            (["--output-dtype", "float16", "--dim", "16"], {"output_dtype": "float16", "dim": 16})):
        npy = tmp_path / "o.npy"
        result = CliRunner().invoke(cli, ["embed", *texts, "--model", str(tiny_bert_dir), *flags, "--output", str(npy)])
        assert result.exit_code == 0, result.output
        rows = petal.Embedder(tiny_bert_dir, **settings).encode(texts)
        np.testing.assert_array_equal(rows, np.load(npy))


def test_search_equals_petal_query(api_index):
    out, _ = api_index
    index = petal.open_index(out)
    assert index.info["dim"] == index.dim == 384 and index.num_vectors == 342
    hits = index.search(QUERIES, k=5)
    result = CliRunner().invoke(cli, ["query", str(out), *QUERIES, "-k", "5", "--json"])
    assert result.exit_code == 0, result.output
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert [[h.id for h in q] for q in hits] == [[h["id"] for h in a["hits"]] for a in answers]
    assert [[float32_value(h.score) for h in q] for q in hits] == [[h["score"] for h in a["hits"]] for a in answers]
    assert all("glacier" in (t or "").lower() for t in index.texts(hits[0][:3]))
    # by vector: the model's query vectors give the very same hits
    vectors = petal.Embedder(device="cpu").encode(QUERIES, query=True)
    assert [[h.id for h in q] for q in index.search(vectors, k=5)] == [[h.id for h in q] for q in hits]


def test_errors_carry_the_exit_codes(tmp_path, api_index):
    out, _ = api_index
    with pytest.raises(petal.NoInputError) as missing:
        petal.index(tmp_path / "nothing-here", tmp_path / "o", json_report=tmp_path / "r.json")
    assert missing.value.exit_code == 66 and isinstance(missing.value, petal.PetalError)
    assert missing.value.report.exit_code == 66
    assert json.loads((tmp_path / "r.json").read_text())["exit_code"] == 66
    cli_result = CliRunner().invoke(cli, ["index", str(tmp_path / "nothing-here"), "--out", str(tmp_path / "o")])
    assert cli_result.exit_code == 66
    with pytest.raises(petal.ConfigError) as model:
        petal.Embedder(tmp_path / "no-model")
    assert model.value.exit_code == 78
    with pytest.raises(petal.UsageError) as bad_metric:
        petal.index(SAMPLE_DATA, tmp_path / "o", metric="cosine")
    assert bad_metric.value.exit_code == 2 and isinstance(bad_metric.value, ValueError)
    with pytest.raises(TypeError, match="'no_such_setting'"):
        petal.index(SAMPLE_DATA, tmp_path / "o", no_such_setting=1)
    with pytest.raises(TypeError, match="'dim'"):
        petal.rebuild(out, dim=3)
    with pytest.raises(petal.UsageError):
        petal.open_index(out).search(np.zeros((1, 7), dtype=np.float32))


def test_rebuild_through_the_api(api_index, tmp_path):
    import shutil

    out, report = api_index
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    rebuilt = petal.rebuild(copy, index_factory="IVF4,Flat", json_report=tmp_path / "r.json")
    assert rebuilt.status == "success" and rebuilt.index["factory"] == "IVF4,Flat"
    assert petal.open_index(copy).info["rebuilt_from"] == report.version


def test_the_readme_api_example_runs(tmp_path):
    """The README's Python API example, as written (its paths moved under tmp_path)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Python API"):]
    start = section.index("```python\n") + len("```python\n")
    example = section[start:section.index("\n```", start)]
    code = example.replace('"/tmp/idx', f'"{tmp_path}/idx').replace('"sample_data"', f'"{SAMPLE_DATA}"')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("success 342 ")
    assert (tmp_path / "idx-report.json").is_file()


def test_where_and_fields_equal_petal_query(tmp_path):
    """``keep_columns=`` through ``petal.index``; ``Index.search(where=)`` and ``Hit.fields`` equal ``petal query``."""
    out = tmp_path / "kept"
    petal.index(SAMPLE_DATA, out, quiet=True, keep_columns=["topic", "title"], max_bad_rows="5%")
    index = petal.open_index(out)
    hits = index.search(QUERIES, k=5, where="topic = 'coffee'")
    assert hits[1] and all(h.fields["topic"] == "coffee" and h.fields["title"] for q in hits for h in q)
    result = CliRunner().invoke(cli, ["query", str(out), *QUERIES, "-k", "5", "--json", "--where", "topic = 'coffee'"])
    assert result.exit_code == 0, result.output
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert [[(h.id, h.fields) for h in q] for q in hits] == [[(h["id"], h["fields"]) for h in a["hits"]]
                                                              for a in answers]
    vectors = petal.Embedder(device="cpu").encode(QUERIES, query=True)  # normalised MiniLM: stored as they are
    stored = index.search_stored(vectors, k=5, where="topic = 'coffee'")
    assert [[h.id for h in q] for q in stored] == [[h.id for h in q] for q in hits]
    with pytest.raises(petal.UsageError, match="nope"):
        index.search(QUERIES, k=5, where="nope = 'x'")


def test_embedder_skips_null_and_blank_texts_in_place(tmp_path):
    embedder = petal.Embedder(device="cpu")
    embedded = embedder.embed(["a glacier", None, "   ", "espresso"])
    assert embedded.skipped == {1: "null_text", 2: "empty_text"}
    assert np.isnan(embedded.rows[1]).all() and np.isnan(embedded.rows[2]).all()
    np.testing.assert_allclose(embedded.rows[[0, 3]], embedder.encode(["a glacier", "espresso"]), atol=1e-6)
    with pytest.raises(petal.NoInputError):
        embedder.encode(["", None])


@pytest.fixture(scope="module")
def embedder():
    return petal.Embedder(device="cpu")


def test_search_takes_any_sequence_of_texts_and_skips_blank_ones(api_index):
    """A numpy array of strings is texts (not vectors); bytes are one text; a None or blank query gets no hits in
    its place (``petal query`` skips it) instead of the hits of an empty embedding or an AttributeError."""
    out, _ = api_index
    index = petal.open_index(out)
    expected = [[h.id for h in q] for q in index.search(QUERIES, k=3)]
    assert [[h.id for h in q] for q in index.search(np.array(QUERIES), k=3)] == expected
    assert [[h.id for h in q] for q in index.search(np.array(QUERIES, dtype=object), k=3)] == expected
    assert [h.id for h in index.search(QUERIES[0].encode(), k=3)[0]] == expected[0]
    mixed = index.search([None, QUERIES[0], "   ", QUERIES[1].encode(), ""], k=3)
    assert [[h.id for h in q] for q in mixed] == [[], expected[0], [], expected[1], []]
    assert index.search(["", None], k=3) == [[], []]


@pytest.mark.parametrize("k", [3.0, 2.5, True, "3", None])
def test_search_k_must_be_an_integer(api_index, k):
    out, _ = api_index
    index = petal.open_index(out)
    vectors = np.ones((1, index.dim), dtype=np.float32)
    for search in (index.search, index.search_stored):
        with pytest.raises(petal.UsageError, match=r"^k .* not an integer"):
            search(vectors, k=k)


def test_search_arguments_are_usage_errors_naming_them(api_index, embedder):
    out, _ = api_index
    index = petal.open_index(out)
    vectors = embedder.encode(QUERIES, query=True)
    by_vectors = [[h.id for h in q] for q in index.search(vectors, k=4)]
    # a numpy integer is a k (a count taken from an array): FAISS's SWIG refused it with a raw TypeError
    assert [[h.id for h in q] for q in index.search(vectors, k=np.int64(4))] == by_vectors
    assert [[h.id for h in q] for q in index.search_stored(vectors.tolist(), k=np.int32(4))] == by_vectors
    for bad, named in ((None, "queries"), ([QUERIES[0], 7], r"queries\[1\]"), (vectors.tolist(), r"queries\[0\]"),
                       (42, "queries")):
        with pytest.raises(petal.UsageError, match=named):
            index.search(bad, k=3)
    with pytest.raises(petal.UsageError, match="where"):
        index.search(QUERIES, k=3, where=5)
    # NaN or infinite query values: FAISS answered NaN with no hits (search) or arbitrary ones (search_stored)
    for value in (np.nan, np.inf):
        broken = vectors.copy()
        broken[1, 7] = value
        for search in (index.search, index.search_stored):
            with pytest.raises(petal.UsageError, match="query vector 1 holds NaN or infinite"):
                search(broken, k=3)
    with pytest.raises(petal.UsageError, match="query vector 0"):
        index.search(np.full((1, index.dim), 1e300), k=3)  # float64 that float32 cannot hold


def test_texts_refuses_hits_of_another_index(api_index, tmp_path):
    """``Index.texts`` of hits from another index read that index's FAISS ids here: another document's text
    (silently) or a 'the version is corrupt' error; now a ``UsageError``. A long-lived ``Index`` stays on the
    version it opened while a new one is published."""
    out, _ = api_index
    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["glaciers flow downhill", "espresso is coffee",
                                                             "cats purr on laps"]}), shards / "s.parquet")
    small_out = tmp_path / "small"
    petal.index(shards, small_out, quiet=True)
    big, small = petal.open_index(out), petal.open_index(small_out)
    small_hits = small.search("coffee", k=3)[0]
    big_hits = big.search("coffee", k=10)[0]
    assert small.texts(small_hits)[0] == "espresso is coffee"
    with pytest.raises(petal.UsageError, match="not a hit of this index"):
        big.texts(small_hits)  # FAISS ids 0..2 exist in the big index too: its documents' texts came back
    with pytest.raises(petal.UsageError, match="not a hit of this index"):
        small.texts(big_hits)
    with pytest.raises(petal.UsageError, match="not a Hit"):
        small.texts(small.search(["coffee"], k=3))  # the list of lists search() returns
    with pytest.raises(petal.UsageError, match="a list of Hit"):
        small.texts(small_hits[0])
    # a new version published under a long-lived Index: it keeps answering from the version it opened
    pq.write_table(pa.table({"id": ["d"], "text": ["green tea leaves"]}), shards / "t.parquet")
    petal.index(shards, small_out, quiet=True)
    assert small.num_vectors == 3 and len(small.search("tea", k=10)[0]) == 3
    assert small.texts(small_hits)[0] == "espresso is coffee"
    assert petal.open_index(small_out).num_vectors == 4


def test_embedder_arguments(embedder):
    """One bytes text is one text (not a list of ints); a wrong type is a ``UsageError`` naming the argument."""
    np.testing.assert_array_equal(embedder.encode(b"glacier ice"), embedder.encode(["glacier ice"]))
    np.testing.assert_array_equal(embedder.encode(np.array(["a", "b"])), embedder.encode(["a", "b"]))
    for bad, named in ((None, "texts"), (5, "texts"), (["ok", 3], r"texts\[1\] is an int")):
        with pytest.raises(petal.UsageError, match=named):
            embedder.encode(bad)
    for bad in ("512", 512.0, True):
        with pytest.raises(petal.UsageError, match=r"batch_tokens .* not an integer"):
            embedder.encode(["a"], batch_tokens=bad)
    assert embedder.encode(["a"], batch_tokens=np.int64(embedder.max_length)).shape == (1, 384)


def test_settings_of_the_wrong_type_are_usage_errors(tmp_path, api_index):
    """A keyword of the wrong type is a ``UsageError`` naming it, before any work: not a ``TypeError`` from a
    comparison inside, nor a float taken as a count (``dim=16.0`` built an Embedder)."""
    out, _ = api_index
    for settings, named in (({"dim": "16"}, "dim='16' is a str"), ({"dim": 16.5}, "dim=16.5 is a float"),
                            ({"keep_versions": "2"}, "keep_versions"), ({"wait": "no"}, "wait='no' is a str"),
                            ({"text_column": 5}, "text_column"), ({"index_factory": 5}, "index_factory=5")):
        with pytest.raises(petal.UsageError, match=named):
            petal.index(SAMPLE_DATA, tmp_path / "o", **settings)
    assert not (tmp_path / "o").exists()
    with pytest.raises(petal.UsageError, match="sources"):
        petal.index(None, tmp_path / "o")
    with pytest.raises(petal.UsageError, match="out"):
        petal.index(SAMPLE_DATA, None)
    with pytest.raises(petal.UsageError, match="target_recall='high'"):
        petal.rebuild(out, target_recall="high")
    with pytest.raises(petal.UsageError, match="out"):
        petal.rebuild(None)
    for settings, named in (({"dim": 16.0}, "dim=16.0"), ({"max_length": "128"}, "max_length"),
                            ({"allow_pickle_weights": "yes"}, "allow_pickle_weights")):
        with pytest.raises(petal.UsageError, match=named):
            petal.Embedder(**settings)
    for settings, named in (({"nprobe": 2.5}, "nprobe"), ({"nprobe": "3"}, "nprobe"), ({"rescore": 1.5}, "rescore")):
        with pytest.raises(petal.UsageError, match=named):
            petal.open_index(out, **settings)
    with pytest.raises(petal.UsageError, match="path"):
        petal.open_index(None)


def test_flag_values_the_run_judges_are_usage_errors(tmp_path):
    """``dim=`` above the model's width and ``max_length=`` above its limit (judged once the model is known) are
    ``petal.UsageError`` like every other bad setting (exit 2); ``petal index`` writes its report for them, and the
    CLI says them as a run's error, without click's usage banner."""
    for settings, named in (({"dim": 100000}, "dim 100000"), ({"max_length": 100000}, "max_length 100000")):
        with pytest.raises(petal.UsageError, match=named) as caught:
            petal.Embedder(**settings).encode(["glacier ice"])
        assert caught.value.exit_code == 2
    report = tmp_path / "r.json"
    with pytest.raises(petal.UsageError, match=r"^dim 100000") as caught:
        petal.index(SAMPLE_DATA, tmp_path / "o", dim=100000, json_report=report)
    assert json.loads(report.read_text())["exit_code"] == 2
    result = CliRunner().invoke(cli, ["embed", "--dim", "100000", "glacier ice"])
    assert result.exit_code == 2 and "--dim 100000" in result.output and "Usage:" not in result.output
