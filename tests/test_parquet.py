"""[1]-[2] Reading shards, checking them up front, bad rows, tokenization and truncation counts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.documents import read_documents
from petal.pipeline.ingest.parquet import preflight, read_rows, resolve_sources
from petal.pipeline.ingest.tokens import TextTokenizer, tokenize_documents
from petal.pipeline.reliability.errors import BadInputError, NoInputError


def test_resolve_sources_files_dirs_globs(shard_writer, tmp_path):
    a = shard_writer("b/a.parquet", {"id": [1], "text": ["x"]})
    b = shard_writer("a/z.parquet", {"id": [2], "text": ["y"]})
    c = shard_writer("a/deep/c.parquet", {"id": [3], "text": ["z"]})
    (tmp_path / "data" / "a" / "notes.txt").write_text("not parquet")
    found = resolve_sources([str(tmp_path / "data")])
    assert found == sorted([a, b, c], key=lambda p: str(p.resolve()))
    assert resolve_sources([str(tmp_path / "data" / "a" / "*.parquet")]) == [b]
    assert resolve_sources([str(a), str(a), str(tmp_path / "data" / "b")]) == [a]  # de-duplicated
    with pytest.raises(NoInputError, match="does not exist"):
        resolve_sources([str(tmp_path / "missing.parquet")])
    with pytest.raises(NoInputError, match="matches no files"):
        resolve_sources([str(tmp_path / "*.nothing")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoInputError, match=r"no \*\.parquet"):
        resolve_sources([str(tmp_path / "empty")])


def test_preflight_names_file_column_and_type(shard_writer, tmp_path):
    read = ReadConfig()
    good = shard_writer("good.parquet", {"id": [1], "text": ["x"]})
    no_text = shard_writer("notext.parquet", {"id": [1], "body": ["x"]})
    int_text = shard_writer("inttext.parquet", {"id": [1], "text": [5]})
    float_id = shard_writer("floatid.parquet", {"id": [1.5], "text": ["x"]})
    corrupt = tmp_path / "data" / "corrupt.parquet"
    corrupt.write_bytes(good.read_bytes()[:-20])  # truncated footer
    empty = tmp_path / "data" / "zero.parquet"
    empty.write_bytes(b"")
    text_file = tmp_path / "data" / "text.parquet"
    text_file.write_text("id,text\n1,hello\n")
    assert preflight([good], read)[0].num_rows == 1
    cases = [(no_text, "text column 'text' is missing \\(columns: 'id', 'body'\\)"),
             (int_text, "text column 'text' has type int64"),
             (float_id, "id column 'id' has type double"),
             (corrupt, "not a readable Parquet file"), (empty, "not a readable Parquet file"),
             (text_file, "not a readable Parquet file")]
    for path, message in cases:
        with pytest.raises(BadInputError, match=message) as info:
            preflight([good, path], read)
        assert str(path) in str(info.value)
    with pytest.raises(BadInputError) as info:  # all problems in one message
        preflight([no_text, int_text], read)
    assert "notext.parquet" in str(info.value) and "inttext.parquet" in str(info.value)


def test_missing_id_column_synthesizes_ids_unless_required(shard_writer):
    path = shard_writer("noid.parquet", {"text": ["a", "b", "c"]})
    info = preflight([path], ReadConfig())[0]
    assert not info.has_id_column
    batch = next(read_rows(0, info, ReadConfig()))
    assert batch.ids == [f"{path}:0", f"{path}:1", f"{path}:2"]
    with pytest.raises(BadInputError, match="id column 'doc' is missing"):
        preflight([path], ReadConfig(id_column="doc", id_column_required=True))


def test_mixed_id_types_across_shards_are_refused(shard_writer):
    a = shard_writer("a.parquet", {"id": [1], "text": ["x"]})
    b = shard_writer("b.parquet", {"id": ["1"], "text": ["y"]})
    with pytest.raises(BadInputError, match="integer in some shards and a string in others"):
        preflight([a, b], ReadConfig())


def test_streaming_reads_in_batches_and_bad_rows_are_counted(shard_writer):
    texts = ["ok one", None, "", "  \n\t ", "ok two", "dup", b"\xff\xfe not utf8", "ok three"]
    ids = ["a", "b", "c", "d", "e", "a", "g", None]
    path = shard_writer("bad.parquet", {"id": ids, "text": [t.decode("latin1") if isinstance(t, bytes) else t
                                                             for t in texts]}, row_group_size=3)
    binary = shard_writer("bin.parquet", {"id": ["x", "y"], "text": pa.array([b"fine", b"\xff\xfe"], pa.binary())})
    read = ReadConfig(batch_rows=3)
    infos = preflight([path, binary], read)
    batches = list(read_rows(0, infos[0], read))
    assert [b.row_start for b in batches] == [0, 3, 6] and sum(len(b.texts) for b in batches) == 8
    docs = list(read_documents(infos, read))
    assert [d.final for d in docs].count(True) == 2
    kept = [(d.shard_index, row) for d in docs for row in d.rows]
    rejects = sorted((d.shard_index, row, why) for d in docs for row, why in d.rejects)
    assert kept == [(0, 0), (0, 4), (0, 6), (1, 0)]
    assert rejects == [(0, 1, "null_text"), (0, 2, "empty_text"), (0, 3, "empty_text"), (0, 5, "duplicate_id"),
                       (0, 7, "null_id"), (1, 1, "invalid_utf8")]


def test_tokenization_truncates_and_counts(minilm_spec):
    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, 16)
    out = tokenizer.encode(["short text", "word " * 40, "x" * 100_000])
    assert [len(x) for x in out.token_ids][:2] == [4, 16]
    assert out.truncated.tolist() == [False, True, False]  # "x" * 100_000 is one word: [CLS] [UNK] [SEP]
    assert all(x.dtype == np.int32 and x[0] == 101 and x[-1] == 102 for x in out.token_ids)  # [CLS] ... [SEP]
    capped = TextTokenizer(minilm_spec.tokenizer_file, 256, max_chars=50)
    out = capped.encode(["a " * 100, "a " * 300])  # past the cap: truncated only where the whole text is
    assert out.truncated.tolist() == [False, True] and [len(x) for x in out.token_ids] == [102, 256]


@pytest.mark.parametrize("prompt", ["", "query: "])
def test_one_text_alone_tokenizes_as_in_a_batch(minilm_spec, prompt):
    """A lone text takes the single-text encoder: the same ids and truncation flag as inside a batch
    (prompt, truncation at the max length, the character cap)."""
    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, 16, max_chars=300, prompt=prompt)
    texts = ["short text", "word " * 40, "x" * 1000, "Ünïcödé — emoji 🙂 and\ttabs", "a " * 200]
    batch = tokenizer.encode(texts)
    for i, text in enumerate(texts):
        alone = tokenizer.encode([text])
        np.testing.assert_array_equal(alone.token_ids[0], batch.token_ids[i])
        assert alone.token_ids[0].dtype == np.int32 and alone.truncated[0] == batch.truncated[i]
    assert batch.truncated.tolist() == [False, True, False, False, True]  # "x" * 1000: [CLS] [UNK] [SEP]


@pytest.mark.parametrize("path", ["wordpiece", "bare"])
@pytest.mark.parametrize("max_length", [8, 256])
def test_lone_ascii_texts_take_the_python_paths_with_the_same_ids(minilm_spec, max_length, path):
    """A lone plain-ASCII text takes a Python path: the whole WordPiece encoding with a word cache
    (pipeline/ingest/lone_wordpiece.py, MiniLM's default) or the Python normaliser before a copy of the
    tokenizer without its own (pipeline/ingest/ascii_normalize.py). Over random texts of printable ASCII,
    tabs, newlines, other control characters, non-ASCII letters and added tokens' texts ("[MASK]", which
    the tokenizer matches before normalising), long ones truncated, the ids and truncation flags equal the
    batch path's, and the texts the fast path declines are exactly those that are not plain ASCII or hold
    an added token's text (in any case)."""
    import random
    import string

    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, max_length)
    assert tokenizer._wordpiece is not None and tokenizer._ascii is None  # MiniLM: BERT WordPiece
    if path == "bare":
        from petal.pipeline.ingest.ascii_normalize import AsciiBertNormalizer

        tokenizer._wordpiece = None
        tokenizer._ascii = AsciiBertNormalizer.for_tokenizer(tokenizer._tokenizer)
        assert tokenizer._ascii is not None and tokenizer._ascii.lowercase
    rng = random.Random(max_length)
    alphabet = string.printable + "\x00\x01\x0b\x0c\x1f\x7f" + "éÜñ中文—🙂\u00a0\u2003"
    added = ["[MASK]", "[mask]", "[SEP]", "[Cls]", "[PAD]", "[UNK]", "[MASK", "MASK]"]
    texts = ["Hello\tWorld\r\nAGAIN", "e.g. U.S.A. costs $100,000!!", "don't STOP", " ", "\n\t", "",
             "what is [MASK]?", "a[SEP]b", "x" * 300, "supercalifragilisticexpialidocious " * 30]
    for _ in range(1500):
        pool = string.printable.replace("\x0b", "").replace("\x0c", "") if rng.random() < 0.7 else alphabet
        text = "".join(rng.choice(pool) for _ in range(rng.randint(0, 120)))
        if rng.random() < 0.1:
            cut = rng.randint(0, len(text))
            text = text[:cut] + rng.choice(added) + text[cut:]
        texts.append(text * (rng.randint(2, 20) if rng.random() < 0.05 else 1))
    batch = tokenizer.encode([*texts, "pad"])  # two or more texts: the batch encoder
    fast = 0
    for _ in range(2):  # the second time round: every word from the cache, the bare copy made
        for i, text in enumerate(texts):
            alone = tokenizer.encode([text])
            np.testing.assert_array_equal(alone.token_ids[0], batch.token_ids[i], err_msg=repr(text))
            assert alone.token_ids[0].dtype == np.int32 and alone.truncated[0] == batch.truncated[i], repr(text)
            plain = text.isascii() and all(c in string.printable and c not in "\x0b\x0c" for c in text) \
                and not any(a.lower() in text.lower() for a in added[:6])
            taken = (tokenizer._wordpiece(text) is not None if path == "wordpiece" else
                     tokenizer._ascii(text) is not None and tokenizer._added.search(text) is None)
            assert taken == plain, repr(text)
            fast += plain
    assert fast > 1800 and batch.truncated.sum() > 10  # most texts took the fast path; some were cut


def test_lone_wordpiece_splits_new_words_itself_and_bounds_its_work(minilm_spec, monkeypatch):
    """From the second text with a word not cached, such words are split by WordPiece in Python (whole words,
    "##" pieces, unknown pieces, words over the model's length limit, long words of common or rare pieces),
    not through the tokenizer (the first text's words are learnt from its encoding); a text whose
    split would take more vocabulary lookups than its budget is declined and encoded by the tokenizer.
    Every answer equals the batch path's."""
    import random

    from petal.pipeline.ingest import lone_wordpiece

    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, 512)
    wordpiece = tokenizer._wordpiece
    assert wordpiece is not None
    tokenizer.encode(["a first query"])  # learnt from the tokenizer's encoding: a one-shot process stops here
    assert wordpiece._split is None and "first" in wordpiece._cache
    tokenizer.encode(["a second one"])  # the second text with a new word: the vocabulary is read, split here
    assert wordpiece._split is not None and "second" in wordpiece._cache
    warmed = TextTokenizer(minilm_spec.tokenizer_file, 512)
    warmed.prepare_lone()  # a server's warm-up: made before any request
    assert warmed._wordpiece is not None and warmed._wordpiece._split is not None
    rng = random.Random(5)
    rare = " ".join("".join(rng.choice("qxzjvkw") for _ in range(95)) for _ in range(6))
    common = " ".join("".join(rng.choice(["in", "re", "co", "st"]) for _ in range(45)) for _ in range(6))
    texts = ["tokenization of unaffable xyzzyq words", "q" * 101 + " b", "##ing a-b_c 3.14159", rare, common,
             "glaciers " + "".join(rng.choice("qxzjvkw") for _ in range(40))]
    batch = tokenizer.encode([*texts, "pad"])
    calls = []
    real = wordpiece._split
    monkeypatch.setattr(wordpiece, "_split", lambda word, budget: calls.append(word) or real(word, budget))

    def check(declined: set[str]) -> None:
        for i, text in enumerate(texts):
            wordpiece._cache.clear()
            got = wordpiece(text)
            assert (got is None) == (text in declined), repr(text)
            if got is not None:
                np.testing.assert_array_equal(got[0], batch.token_ids[i])
            wordpiece._cache.clear()
            np.testing.assert_array_equal(tokenizer.encode([text]).token_ids[0], batch.token_ids[i])

    check(set())
    assert "unaffable" in calls and "xyzzyq" in calls
    # a budget of what the first three texts take: the long words (up to ~2 lookups a character) pass it

    def lookups(text: str) -> int:
        return sum(real(word, 10**9)[1] for word in lone_wordpiece._WORDS.findall(wordpiece._normalize(text)))

    limit = max(lookups(text) for text in texts[:3])
    assert min(lookups(text) for text in texts[3:]) > limit
    monkeypatch.setattr(lone_wordpiece, "LOOKUPS_PER_CHAR", 0)
    monkeypatch.setattr(lone_wordpiece, "LOOKUPS_PER_TEXT", limit)
    check(set(texts[3:]))


def test_lone_wordpiece_cache_is_left_out_of_garbage_collections(minilm_spec):
    """The word cache of a server's lone-text path (up to MAX_CACHED_WORDS words) holds nothing the cyclic
    collector walks once a collection has met it: every full collection of a long-running server walked each
    cached word's list of ids (lists are always tracked), a pause that stalls every request in flight. Words learnt
    from the tokenizer's own encoding and words split here both; the ids are the tokenizer's."""
    import gc

    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, 512)
    wordpiece = tokenizer._wordpiece
    assert wordpiece is not None
    texts = ["a first query about glaciers", "unaffable xyzzyq tokenization of words",
             "the second text splits new words here", "glaciers move slowly downhill under their own weight"]
    got = [tokenizer.encode([text]).token_ids[0] for text in texts]  # one at a time: the lone path
    assert wordpiece._split is not None and {"first", "unaffable", "downhill"} <= set(wordpiece._cache)
    batch = tokenizer.encode([*texts, "pad"])  # the tokenizer's own batch encoding
    for mine, theirs in zip(got, batch.token_ids):
        np.testing.assert_array_equal(mine, theirs)
    gc.collect()
    tracked = [word for word, ids in wordpiece._cache.items() if gc.is_tracked(ids)]
    assert not tracked, tracked


@pytest.mark.parametrize("continuing", ["##", ""])
def test_wordpiece_split_matches_the_model_or_is_not_made(continuing):
    """The Python split of a small WordPiece model (with the "##" continuing prefix, and with none) gives the
    model's own ``tokenize`` ids on every word of a random alphabet (pieces, unknown rests, the length limit);
    a model whose unknown token is not in its vocabulary gets no split."""
    import random

    from tokenizers import Tokenizer
    from tokenizers.models import WordPiece

    from petal.pipeline.ingest.lone_wordpiece import WordPieceSplit

    vocab = {"[UNK]": 0, "a": 1, "ab": 2, "abc": 3, "##b": 4, "##c": 5, "##bc": 6, "in": 7, "##g": 8, "c": 9,
             "##ing": 10, "gin": 11}
    vocab = {k.replace("##", continuing): v for k, v in reversed(vocab.items())}  # no prefix: the first id kept
    assert WordPieceSplit.for_tokenizer(Tokenizer(WordPiece({k: v for k, v in vocab.items() if k != "[UNK]"},
                                                            unk_token="[UNK]"))) is None
    model = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=7,
                                continuing_subword_prefix=continuing))
    split = WordPieceSplit.for_tokenizer(model)
    assert split is not None
    rng = random.Random(3)
    for _ in range(3000):
        word = "".join(rng.choice("abcging") for _ in range(rng.randint(1, 9)))
        assert split(word, 1 << 30)[0] == [token.id for token in model.model.tokenize(word)], word


def test_lone_texts_leave_added_tokens_matched_after_normalising_to_the_tokenizer(tmp_path, minilm_spec):
    """An added token the tokenizer matches in the normalised text ("hello world", normalized=True) is found
    by the lone paths there too: a raw text with a tab or capitals between its words gives the batch's ids."""
    from tokenizers import AddedToken, Tokenizer

    base = Tokenizer.from_file(str(minilm_spec.tokenizer_file))
    base.add_tokens([AddedToken("hello world", normalized=True)])
    path = tmp_path / "tokenizer.json"
    base.save(str(path))
    texts = ["say hello\tworld now", "HELLO WORLD", "hello  world", "hello\nworld!", "helloworld"]
    for path_kind in ("wordpiece", "bare"):
        tokenizer = TextTokenizer(path, 64)
        if path_kind == "bare":
            from petal.pipeline.ingest.ascii_normalize import AsciiBertNormalizer

            tokenizer._wordpiece = None
            tokenizer._ascii = AsciiBertNormalizer.for_tokenizer(tokenizer._tokenizer)
        batch = tokenizer.encode([*texts, "pad"])
        assert len(batch.token_ids[0]) == 5  # [CLS] say <hello world> now [SEP]: the added token matched
        for warm in ("say hello now", "world", "say hello now", "world"):  # every word cached (and the bare copy)
            tokenizer.encode([warm])
        for _ in range(2):
            for i, text in enumerate(texts):
                np.testing.assert_array_equal(tokenizer.encode([text]).token_ids[0], batch.token_ids[i],
                                              err_msg=f"{path_kind}: {text!r}")


def test_lone_wordpiece_declines_other_tokenizers(tmp_path, minilm_spec):
    """The WordPiece path is only for BertNormalizer + BertPreTokenizer + WordPiece with a fixed template;
    another pre-tokenizer (here Whitespace, which splits differently) keeps the tokenizer's own encoding."""
    from tokenizers import Tokenizer
    from tokenizers.pre_tokenizers import Whitespace

    from petal.pipeline.ingest.lone_wordpiece import LoneWordPiece

    base = Tokenizer.from_file(str(minilm_spec.tokenizer_file))
    base.no_padding()
    assert LoneWordPiece.for_tokenizer(base, 64) is not None
    assert LoneWordPiece.for_tokenizer(base, 3) is None  # the probes do not fit: declined, not wrong
    base.pre_tokenizer = Whitespace()
    assert LoneWordPiece.for_tokenizer(base, 64) is None
    path = tmp_path / "tokenizer.json"
    base.save(str(path))
    tokenizer = TextTokenizer(path, 64)
    assert tokenizer._wordpiece is None and tokenizer._ascii is not None
    tokenizer.prepare_lone()  # a server's warm-up: the copy without the normaliser, made before any request
    assert tokenizer._bare is not None
    texts = ["don't stop", "e.g. a-b_c", "x y"]
    batch = tokenizer.encode([*texts, "pad"])
    for _ in range(2):
        for i, text in enumerate(texts):
            np.testing.assert_array_equal(tokenizer.encode([text]).token_ids[0], batch.token_ids[i])


def test_tokenize_documents_keeps_rows_aligned(shard_writer, minilm_spec):
    path = shard_writer("t.parquet", {"id": [10, 11, 12], "text": ["alpha", None, "beta gamma " * 50]})
    read = ReadConfig()
    chunks = list(tokenize_documents(read_documents(preflight([path], read), read),
                                     TextTokenizer(minilm_spec.tokenizer_file, 32)))
    rows = [(r, i, len(t)) for c in chunks for r, i, t in zip(c.rows, c.ids, c.token_ids)]
    assert rows == [(0, 10, 3), (2, 12, 32)]
    assert [r for c in chunks for r in c.truncated_rows] == [2]
    assert [x for c in chunks for x in c.rejects] == [(1, "null_text")]
    assert chunks[-1].final


def test_tokenize_documents_in_parallel_matches_serial(shard_writer, minilm_spec):
    """Two workers tokenizing batches at once give the serial result, batch for batch, in order."""
    texts = [None if i % 97 == 0 else " ".join(["word"] * (1 + i % 40)) + f" {i}" for i in range(3000)]
    paths = [shard_writer(f"p{s}.parquet", {"id": list(range(s * 3000, (s + 1) * 3000)), "text": texts})
             for s in range(2)]
    read = ReadConfig(batch_rows=128)  # many small batches: dozens in flight at once
    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, 16)

    def flat(workers: int) -> list:
        chunks = tokenize_documents(read_documents(preflight(paths, read), read), tokenizer, workers)
        return [(c.shard_index, c.final, c.rows, c.ids, [t.tolist() for t in c.token_ids], c.truncated_rows,
                 c.rejects) for c in chunks]

    serial = flat(1)
    assert len(serial) > 40 and sum(len(c[2]) for c in serial) == 2 * (3000 - 31)
    assert flat(2) == serial
    assert flat(4) == serial
