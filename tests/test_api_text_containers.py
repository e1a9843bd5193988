"""Texts as Python code holds them: a pandas column (a missing text is NaN, ``pd.NA`` or ``None``), a numpy object
array with NaN, a pyarrow ``Array`` / ``ChunkedArray`` (``pq.read_table(f)["text"]``). ``Embedder.encode`` and
``Index.search`` take them as the list of ``str`` and ``None`` they hold: a missing text is a null one (skipped in
its place, as ``petal index`` and ``petal embed --input`` skip the same Parquet cell), never a ``UsageError`` 'a
float, not a str' or 'a StringScalar, not a str'. Real tiny BERT, real FAISS."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import petal
from petal.cli.main import cli

pd = pytest.importorskip("pandas")

TEXTS = ["glaciers flow downhill", None, "bread rises with yeast"]


def containers() -> dict[str, object]:
    return {
        "pandas object, None": pd.Series(TEXTS, dtype=object),
        "pandas str, NaN": pd.Series(TEXTS, dtype="str"),
        "pandas string, NA": pd.Series(TEXTS, dtype="string"),
        "pandas DataFrame column": pd.DataFrame({"text": TEXTS})["text"],
        "numpy object, NaN": np.array([TEXTS[0], np.nan, TEXTS[2]], dtype=object),
        "list with NaN": [TEXTS[0], float("nan"), TEXTS[2]],
        "pyarrow Array": pa.array(TEXTS),
        "pyarrow large_string": pa.array(TEXTS, pa.large_string()),
        "pyarrow ChunkedArray": pa.chunked_array([TEXTS[:2], TEXTS[2:]]),
    }


@pytest.fixture(scope="module")
def embedder(tiny_bert_dir):
    with petal.Embedder(tiny_bert_dir, device="cpu") as opened:
        yield opened


@pytest.mark.parametrize("kind", list(containers()))
def test_encode_takes_a_column_with_missing_texts_as_nulls(embedder, kind):
    expected = embedder.embed(TEXTS)
    got = embedder.embed(containers()[kind])
    assert got.skipped == expected.skipped == {1: "null_text"}
    np.testing.assert_array_equal(got.rows, expected.rows)


@pytest.fixture(scope="module")
def index(tmp_path_factory, tiny_bert_dir):
    root = tmp_path_factory.mktemp("containers")
    pq.write_table(pa.table({"id": [0, 1, 2], "text": [t or "nothing" for t in TEXTS]}), root / "docs.parquet")
    result = CliRunner().invoke(cli, ["index", str(root / "docs.parquet"), "--out", str(root / "out"), "--model",
                                      str(tiny_bert_dir), "-q"])
    assert result.exit_code == 0, result.output
    with petal.open_index(root / "out") as opened:
        yield opened


@pytest.mark.parametrize("kind", list(containers()))
def test_search_takes_a_column_with_missing_queries_as_nulls(index, kind):
    expected = [[(hit.id, hit.score) for hit in hits] for hits in index.search(TEXTS, k=2)]
    got = [[(hit.id, hit.score) for hit in hits] for hits in index.search(containers()[kind], k=2)]
    assert got == expected and got[1] == [] and got[0] and got[2]


def test_other_items_are_still_refused(embedder):
    for texts in (pd.Series([1.5, 2.5]), pa.array([1, 2]), [TEXTS[0], 3]):
        with pytest.raises(petal.UsageError, match=r"texts(\[\d\] is|: a pandas\.Series of float64 numbers is not)"):
            embedder.encode(texts)


@pytest.mark.parametrize("array", [np.array([["a", "b"], ["c", "d"]]), np.array([[["a"]]], dtype=object)])
def test_an_array_of_more_than_one_dimension_is_named_with_its_shape(embedder, index, array):
    """Was "texts[0] is a list, not a str" (``tolist()`` made its rows lists): no word of the array, its shape or
    what to pass."""
    shape = tuple(array.shape)
    for call, name in ((embedder.encode, "texts"), (embedder.embed, "texts"), (index.search, "queries")):
        with pytest.raises(petal.UsageError) as caught:
            call(array)
        assert isinstance(caught.value, TypeError)
        assert str(caught.value).startswith(f"{name}: a numpy.ndarray of shape {shape} is {len(shape)}-D: pass a "
                                            f"1-D array or a list of texts ({name}.ravel() for one text a cell)")


def test_skipped_texts_are_named_by_their_positions(embedder):
    """The message read "1 skipped (empty_text 1; inputs 0)": a count of no inputs, not the input at 0."""
    with pytest.raises(petal.NoInputError, match=r"^nothing to embed: 1 skipped \(empty_text 1; at input 0\)$"):
        embedder.encode([" "])
    with pytest.raises(petal.NoInputError, match=r"2 skipped \(empty_text 1, null_text 1; at inputs 0, 1\)$"):
        embedder.encode(["", None])
