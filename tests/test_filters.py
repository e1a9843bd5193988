"""Filtered search (--where) inside FAISS: recall against brute-force filtered search, Flat and IVF;
the grammar and its errors. Vectors from the tests' fake engine; Parquet, store and FAISS are real."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.faiss_loader import load_faiss
from petal.pipeline.index.filters import Clause, parse_filter
from petal.pipeline.index.search import IndexReader
from tests.fake_cli import invoke as fake_invoke
from tests.fake_engine import make_fake_model_dir

ROWS = 3000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("filters")
    ids = [f"d{i}" for i in range(ROWS)]
    pq.write_table(pa.table({"id": ids, "text": [f"document {i} on subject {i % 97}" for i in range(ROWS)],
                             "lang": [f"l{i % 10}" for i in range(ROWS)], "year": [2000 + i % 3 for i in range(ROWS)]}),
                   root / "docs.parquet")
    return root / "docs.parquet", make_fake_model_dir(root / "model")


def build(corpus, out: Path, factory: str, *flags: str) -> IndexReader:
    shard, model = corpus
    result = fake_invoke(["index", str(shard), "--out", str(out), "--model", str(model), "-q",
                                      "--keep-columns", "lang,year", "--index-factory", factory, *flags],
                                env={"PETAL_TEST_FAKE_ENGINE": str(out.parent / "log")})
    assert result.exit_code == 0, result.output
    return IndexReader(out)


def all_vectors(reader: IndexReader) -> np.ndarray:
    faiss = load_faiss()
    ivf = faiss.try_extract_index_ivf(reader.index)
    if ivf is not None:
        ivf.make_direct_map()
    return reader.index.reconstruct_n(0, reader.ntotal)


def brute_force(vectors: np.ndarray, mask: np.ndarray, queries: np.ndarray, k: int) -> list[set[int]]:
    allowed = np.flatnonzero(mask)
    scores = queries @ vectors[allowed].T
    return [set(allowed[np.argsort(-row)[:k]].tolist()) for row in scores]


@pytest.mark.parametrize("factory", ["Flat", "IVF32,Flat"])
def test_filtered_search_matches_brute_force(corpus, tmp_path, factory):
    reader = build(corpus, tmp_path / "idx", factory)
    vectors = all_vectors(reader)
    columns = pq.read_table(reader.dir / "ids.parquet", columns=["lang", "year"])  # stored with the ids
    lang = np.array(columns.column("lang").to_pylist())
    year = np.array(columns.column("year").to_pylist())
    rng = np.random.default_rng(0)
    queries = vectors[rng.choice(len(vectors), 50, replace=False)] + 0.3 * rng.standard_normal(
        (50, vectors.shape[1])).astype(np.float32)
    for where, mask in [("lang = 'l3'", lang == "l3"),
                        ("lang IN ('l1', 'l2') AND year = 2001", np.isin(lang, ["l1", "l2"]) & (year == 2001))]:
        truth = brute_force(vectors, mask, queries, 10)
        hits = reader.search(queries, 10, where=where)
        assert all(len(h) == 10 for h in hits)  # post-filtering the top 10 would leave ~1-2 per query
        allowed = set(np.flatnonzero(mask).tolist())
        assert all(h.faiss_id in allowed for row in hits for h in row)
        assert all(h.fields["lang"] == lang[h.faiss_id] for row in hits for h in row)
        recall = np.mean([len({h.faiss_id for h in row} & t) / 10 for row, t in zip(hits, truth)])
        assert recall >= (0.999 if factory == "Flat" else 0.9), (where, recall)


def test_a_filter_nothing_matches_gives_no_hits(corpus, tmp_path):
    reader = build(corpus, tmp_path / "idx", "Flat")
    assert reader.search(all_vectors(reader)[:2], 5, where="lang = 'zz'") == [[], []]
    # petal query says why there are none (not "the index is empty": it holds every row)
    np.save(tmp_path / "q.npy", all_vectors(reader)[:1])
    result = fake_invoke(["query", str(tmp_path / "idx"), "--vector-file", str(tmp_path / "q.npy"), "-k", "3",
                          "--where", "lang = 'zz'"])
    assert result.exit_code == 0, result.output
    assert "(no hits: no row matches --where lang = 'zz')" in result.output, result.output


def test_the_grammar_and_its_errors():
    flt = parse_filter("lang = 'it''s' AND year IN (2020, 2021)")
    assert [(c.column, c.values) for c in flt.clauses] == [("lang", ("it's",)), ("year", (2020, 2021))]
    for bad, said in [("lang == 'en'", "'==' .* is no operator"), ("lang = en", "expected a 'string' or a number"),
                      ("lang = 'en' OR year = 1", "AND"), ("lang IN ('a',", "expected"), ("", "a column"),
                      ("lang = 'en' ; drop", "cannot read")]:
        with pytest.raises(ValueError, match=said):
            parse_filter(bad)


def test_unknown_columns_and_bad_types_are_named(corpus, tmp_path):
    reader = build(corpus, tmp_path / "idx", "Flat")
    query = all_vectors(reader)[:1]
    with pytest.raises(ValueError, match=r"unknown column 'text'.*lang, year"):
        reader.search(query, 5, where="text = 'x'")
    with pytest.raises(ValueError, match="'year' is int64"):
        reader.search(query, 5, where="year = 'recent'")


@pytest.mark.parametrize("metric", ["ip", "l2"])
@pytest.mark.parametrize("where", [None, "lang IN ('l1', 'l2')"])
def test_a_lone_query_scans_its_lists_on_every_thread(corpus, tmp_path, where, metric):
    """IVF: a lone query searches with FAISS's parallel_mode 1 (its lists over every OpenMP thread), batches
    with mode 0; both answer what FAISS's own search answers (same ids, same scores)."""
    faiss = load_faiss()
    reader = build(corpus, tmp_path / "idx", "IVF32,Flat", "--metric", metric)
    ivf = faiss.try_extract_index_ivf(reader.index)
    ivf.nprobe = 8  # of 32 lists
    reader.search_params = {**reader.search_params, "nprobe": 8}
    noise = np.random.default_rng(5).standard_normal((80, reader.dim)).astype(np.float32)
    queries = all_vectors(reader)[: len(noise)] + 0.2 * noise
    if where:
        selector = reader.selector(where)  # NOTE: a filter's search probes more lists, ntotal / matches times more
        params = selector.params(reader.index, reader._params_for(10, selector.count))
        ref_scores, ref_ids = reader.index.search(queries, 10, params=params)
    else:
        ref_scores, ref_ids = reader.index.search(queries, 10)
    saved = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(4)
    try:
        for rows in (slice(0, 24), slice(0, len(queries))):
            batch = reader.search(queries[rows], 10, where=where)
            assert ivf.parallel_mode == 0
            assert [[h.faiss_id for h in row] for row in batch] == ref_ids[rows].tolist()
            np.testing.assert_allclose([[h.score for h in row] for row in batch], ref_scores[rows], rtol=1e-5,
                                       atol=1e-5)
        for query, expected in zip(queries[:24], batch):
            (lone,) = reader.search(query[None, :], 10, where=where)
            assert ivf.parallel_mode == 1
            assert [h.faiss_id for h in lone] == [h.faiss_id for h in expected]
            np.testing.assert_allclose([h.score for h in lone], [h.score for h in expected], rtol=1e-5, atol=1e-5)
    finally:
        faiss.omp_set_num_threads(saved)


@pytest.mark.parametrize("float_type", ["float16", "float32", "float64"])
def test_a_float_column_compares_as_numbers(tmp_path, float_type):
    """``f = 0`` matched a row holding 0.0 and not one holding -0.0 (``f = -0.0`` the other way round): Arrow's is_in
    compares floats bit for bit, where every comparison of numbers finds the two zeros equal; and a float16 kept
    column was no filter at all (Arrow has no is_in for it: ArrowNotImplementedError, exit 1). Real Parquet, FAISS,
    the API."""
    import petal

    values = np.array([-0.0, 0.0, 1.5, np.nan, 0.25, -2.0], dtype=float_type)
    vectors = np.random.default_rng(0).standard_normal((len(values), 8)).astype(np.float32)
    pq.write_table(pa.table({"id": list(range(len(values))), "f": pa.array(values),
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 8)}),
                   tmp_path / "a.parquet")
    petal.index(tmp_path / "a.parquet", tmp_path / "out", vectors_column="emb", keep_columns="f", quiet=True)
    with petal.open_index(tmp_path / "out") as index:
        def matched(where: str) -> list[int]:
            return sorted(hit.id for hit in index.search_stored(vectors[:1], k=10, where=where)[0])

        assert matched("f = 0") == matched("f = -0.0") == matched("f = 0.0") == [0, 1]
        assert matched("f IN (-0.0, 1.5)") == [0, 1, 2]
        assert matched("f = 0.25") == [4] and matched("f = -2") == [5]


def test_true_rows_reads_a_boolean_column_from_its_bitmaps():
    """``true_rows`` (a filter's matches, read without ``to_numpy``, which imports pandas): chunked, sliced at any
    offset, with nulls (never a match), against Python's reading of the same values."""
    from petal.pipeline.index.filters import true_rows

    rng = np.random.default_rng(0)
    for _ in range(300):
        chunks = []
        for _ in range(int(rng.integers(0, 4))):
            n = int(rng.integers(0, 40))
            column = pa.array(rng.random(n) < 0.5, mask=rng.random(n) < 0.3)
            start = int(rng.integers(0, n + 1))
            chunks.append(column.slice(start, int(rng.integers(0, n - start + 1))))
        flags = pa.chunked_array(chunks, pa.bool_())
        got = true_rows(flags)
        assert got.dtype == bool and got.tolist() == [value is True for value in flags.to_pylist()]


class _CountingText(str):
    """A filter text that counts the copies taken of it (slices): the tokenizer scans the text in place."""

    copies = 0

    def __getitem__(self, key):  # type: ignore[override]
        type(self).copies += 1
        return super().__getitem__(key)


@pytest.mark.parametrize("clauses", [10, 1000])
def test_a_filter_is_read_in_place_not_copied_per_token(clauses):
    """Reading a filter takes a fixed number of copies of it, whatever its length (was: the rest of the text
    copied and stripped at every token, quadratic: a 1 MB ``where`` held petal serve's search thread for 15 s)."""
    _CountingText.copies = 0
    text = _CountingText(" AND ".join(f"lang = 'x{i}'" for i in range(clauses)) + "  ")
    flt = parse_filter(text)
    assert len(flt.clauses) == clauses and flt.clauses[-1] == Clause("lang", (f"x{clauses - 1}",))
    assert _CountingText.copies <= 2, _CountingText.copies


@pytest.mark.parametrize("where, column", [("my-col = 1", "my-col"), ("AND = 1", "AND"), ("true = 1", "true"),
                                           ("IN = 1", "IN"), ("2024col = 1", "2024col"), (".x = 1", ".x")])
def test_a_column_no_bare_name_can_name_is_double_quoted_and_the_error_says_so(where, column):
    """--keep-columns takes any name, the grammar's bare names are letters, digits, _ and . only, starting with a
    letter or _ (and not AND, IN, true, false): the error names the double quotes that read the others (was: no word
    of them anywhere; for ``2024col = 1`` only ``expected a column, got 2024``)."""
    with pytest.raises(ValueError, match='is written in double quotes: "my-col" = 1'):
        parse_filter(where)
    assert parse_filter(f'"{column}" = 1').clauses == (Clause(column, (1,)),)
    with pytest.raises(ValueError) as caught:  # an unterminated string is no name: no hint about names
        parse_filter("x = 'abc")
    assert "double quotes" not in str(caught.value)


@pytest.mark.parametrize("column", ['q"x', '"', 'say "hi"', '""', "it's"])
def test_a_double_quote_in_a_quoted_name_is_doubled(column):
    """``""`` inside a double-quoted name is one ``"``, as ``''`` in a string (was: ``"[^"]+"``, no name holding a
    ``"`` could be written: ``"q""x" = 1`` said ``expected =, got 'x'``)."""
    quoted = '"' + column.replace('"', '""') + '"'
    assert parse_filter(f"{quoted} = 1 AND {quoted} IN ('a')").clauses == (Clause(column, (1,)), Clause(column, ("a",)))


@pytest.mark.parametrize("where, column", [("année = 1", "année"), ("é = 1", "é"), ("名前 = 1", "名前"),
                                           ("ın = 1", "ın"), ("falſe = 1", "falſe"), ("_x.y2 = 1", "_x.y2")])
def test_a_bare_name_takes_letters_of_any_script(where, column):
    """A bare name is letters of any script (was: ASCII only, where the message said "letters"); the keywords and
    ``true``/``false`` are ASCII words (``"ın".upper()`` is ``IN``: a column, not the keyword)."""
    assert parse_filter(where).clauses == (Clause(column, (1,)),)


@pytest.mark.parametrize("where, said", [
    ("i64 = .5", "cannot read '.5' (at character 7): a number is written with a digit on each side of its point"),
    ("i64 = 5.", "cannot read '.' (at character 8): a number is written"),
    ("i64 = +5", "cannot read '+5' (at character 7): a number is written"),
    ("i64 IN (1, -.5)", "cannot read '-.5)'"),
    ("s != 'en'", "'!=' (at character 3) is no operator of the filter, whose operators are = and IN"),
    ("s <> 'en'", "'<>' (at character 3) is no operator"), ("n < 5", "'<' (at character 3) is no operator"),
    ("n >= 5", "'>=' (at character 3)"), ("n == 5", "'==' (at character 3)"),
    ("NOT s = 'en'", "NOT is not supported"), ("s NOT IN ('a')", "NOT is not supported"),
    ("a = 1 AND NOT s = 'en'", "NOT is not supported"),
    ("s IS NULL", "IS NULL is not supported"), ("s is not null", "IS NULL is not supported"),
    ("s = NULL", "NULL is not supported"), ("a = 1 OR b = 2", "OR is not supported"),
    ("s LIKE 'a%'", "LIKE is not supported"), ("n BETWEEN 1 AND 2", "BETWEEN is not supported")])
def test_numbers_and_operators_the_grammar_lacks_are_named(where, said):
    """A number written otherwise than the grammar's, an operator or SQL word it has not: named, with the forms it has
    (was: ``write the column in double quotes`` for ``.5``, ``+5`` and ``!=``; ``expected =, got 's'`` for NOT and
    IS NULL)."""
    with pytest.raises(ValueError) as caught:
        parse_filter(where)
    assert said in str(caught.value), str(caught.value)
    assert "double quotes" not in str(caught.value)
    if "is no operator" in said or "is not supported" in said:
        assert "clauses joined by AND, each \"col = 'x'\" or \"col IN ('a', 'b')\" (no OR, NOT, IS NULL" \
            in str(caught.value)


def test_a_column_so_named_is_still_a_column():
    """The SQL words the grammar names as unsupported are columns where a column belongs."""
    flt = parse_filter("is = 1 AND not = 2 AND null IN (3) AND or = 4")
    assert [c.column for c in flt.clauses] == ["is", "not", "null", "or"]


def test_kept_columns_named_with_a_quote_or_other_letters_filter_through_the_cli(tmp_path):
    """``petal index --keep-columns 'q"x,année'`` then ``petal query --where '"q""x" = 1 AND année = ...'``: the
    rows holding both (was: 'expected =, got 'x'' and a hint to double-quote année, exit 2); an unsupported word
    exits 2 naming it. Real Parquet, ``--vectors-column`` (no model), FAISS, the CLI."""
    from click.testing import CliRunner

    from petal.cli.main import cli

    rows = 12
    data = np.random.default_rng(0).standard_normal((rows, 4)).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(rows), 'q"x': [i % 2 for i in range(rows)],
                             "année": [f"y{i % 3}" for i in range(rows)],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(data.ravel()), 4)}),
                   tmp_path / "docs.parquet")
    out = tmp_path / "idx"
    built = CliRunner().invoke(cli, ["index", str(tmp_path / "docs.parquet"), "--out", str(out), "-q",
                                     "--vectors-column", "emb", "--keep-columns", 'q"x,année'])
    assert built.exit_code == 0, built.output
    np.save(tmp_path / "q.npy", data[:1])

    def query(where: str):
        return CliRunner().invoke(cli, ["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", str(rows),
                                        "--json", "--where", where])

    found = query('"q""x" = 1 AND année = \'y1\'')
    assert found.exit_code == 0, found.output
    hits = json.loads(found.stdout)["hits"]
    assert sorted(h["id"] for h in hits) == [i for i in range(rows) if i % 2 == 1 and i % 3 == 1]
    assert all(h["fields"] == {'q"x': 1, "année": "y1"} for h in hits)
    for where, said in [("NOT année = 'y1'", "NOT is not supported"), ("année IS NULL", "IS NULL is not supported"),
                        ("année != 'y1'", "'!=' (at character 7) is no operator")]:
        refused = query(where)
        assert refused.exit_code == 2 and said in refused.stderr, refused.output
