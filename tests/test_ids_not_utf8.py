"""An id column of strings whose bytes are not UTF-8 (pyarrow writes and reads a string column without checking
it): ``petal index`` skips such a row as a bad row (``invalid_utf8_id``: counted, listed in ``rejects.parquet``,
refused by ``--strict``), as it does a null id and a text that is not UTF-8, in text and ``--vectors-column`` runs,
for ``string``, ``large_string`` and dictionary-encoded columns alike, and never takes such ids for duplicates
across shards; ``petal embed --input X.parquet --id-column`` refuses the file (65 naming it, the column and the
row: it echoes ids, and such an id is no text) and takes ids of the types ``petal index`` takes (integers,
strings: a binary id was echoed as ``"b'\\\\xff'"``). Before: ``UnicodeDecodeError``, a traceback (exit 1), in
every one of these. And ``petal embed``'s ``--id-column`` may name the text column (an ``IndexError`` traceback).

Real ``petal`` processes (the packaged MiniLM, real Parquet and FAISS).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import REPO


def bad_ids(kind: str) -> list[bytes | None]:
    """Not UTF-8, good, a lone surrogate's encoding, null, good: the bad ones the same in every shard."""
    return [b"\xff\xfe", f"{kind}-ok".encode(), b"\xed\xa0\x80", None, f"{kind}-fine".encode()]

TEXTS = ["first document", "second document", "third document", "fourth document", "fifth document"]


def petal(*argv: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def string_ids(kind: str) -> pa.Array:
    raw = pa.array(bad_ids(kind), pa.large_binary() if kind == "large_string" else pa.binary())
    ids = raw.view(pa.large_string() if kind == "large_string" else pa.string())
    return ids.dictionary_encode() if kind == "dictionary" else ids


def rejects(out: Path) -> list[tuple[str, int, str]]:
    version = (out / "CURRENT").read_text().strip()
    table = pq.read_table(out / "versions" / version / "rejects.parquet")
    return [(Path(r["shard"]).name, r["row"], r["reason"]) for r in table.to_pylist()]


def test_text_run_skips_ids_that_are_not_utf8(tmp_path):
    for kind in ("string", "large_string", "dictionary"):
        pq.write_table(pa.table({"id": string_ids(kind), "text": TEXTS}), tmp_path / f"{kind}.parquet")
    shards = [tmp_path / f"{kind}.parquet" for kind in ("string", "large_string", "dictionary")]
    # NOTE: the shards share ids (b"\xff\xfe" among them): --strict judges duplicates across shards first
    strict = petal("index", *shards, "--out", tmp_path / "strict", "--strict")
    assert strict.returncode == 65, strict.stderr[-3000:]
    assert "Traceback" not in strict.stderr
    assert "invalid_utf8_id" in strict.stderr.splitlines()[-1]
    done = petal("index", *shards, "--out", tmp_path / "out", "-q", "--max-bad-rows", "100")
    assert done.returncode == 0, done.stderr[-3000:]
    for shard in shards:
        assert [r for r in rejects(tmp_path / "out") if r[0] == shard.name] == [
            (shard.name, 0, "invalid_utf8_id"), (shard.name, 2, "invalid_utf8_id"), (shard.name, 3, "null_id")]
    found = petal("query", tmp_path / "out", "second document", "--json", "-k", "10")
    assert found.returncode == 0, found.stderr[-3000:]
    assert all(f'"id": "{kind}-{good}"' in found.stdout for kind in ("string", "large_string", "dictionary")
               for good in ("ok", "fine"))


def test_vectors_run_skips_ids_that_are_not_utf8(tmp_path):
    flat = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32).ravel()
    for kind in ("string", "dictionary"):
        pq.write_table(pa.table({"id": string_ids(kind), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), 4)}),
                       tmp_path / f"{kind}.parquet")
    shards = [tmp_path / "string.parquet", tmp_path / "dictionary.parquet"]
    done = petal("index", *shards, "--out", tmp_path / "out", "-q", "--vectors-column", "emb")
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(rejects(tmp_path / "out")) == sorted(
        (shard.name, row, reason) for shard in shards
        for row, reason in ((0, "invalid_utf8_id"), (2, "invalid_utf8_id"), (3, "null_id")))


def test_embed_refuses_ids_that_are_not_text(tmp_path):
    pq.write_table(pa.table({"id": string_ids("string"), "text": TEXTS}), tmp_path / "bad.parquet")
    binary_ids = pa.array(bad_ids("binary"), pa.binary())
    pq.write_table(pa.table({"id": binary_ids, "text": TEXTS}), tmp_path / "binary.parquet")
    bad = petal("embed", "--input", tmp_path / "bad.parquet", "--id-column", "id", "--output", tmp_path / "e.jsonl")
    assert bad.returncode == 65, bad.stderr[-3000:]
    assert "bad.parquet: id column 'id' holds bytes that are not UTF-8 at row 0" in bad.stderr
    binary = petal("embed", "--input", tmp_path / "binary.parquet", "--id-column", "id", "--output",
                   tmp_path / "e.jsonl")
    assert binary.returncode == 65, binary.stderr[-3000:]
    assert "binary.parquet: id column 'id' has type binary, expected an integer or string" in binary.stderr
    assert not (tmp_path / "e.jsonl").exists()


def test_embed_id_column_may_name_the_text_column(tmp_path):
    """The text is then each input's id, as a .jsonl's "text" key may be (it was an IndexError traceback, exit 1)."""
    pq.write_table(pa.table({"text": ["first document", "second document"]}), tmp_path / "t.parquet")
    done = petal("embed", "--input", tmp_path / "t.parquet", "--id-column", "text", "--output", tmp_path / "e.jsonl")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert [(line["index"], line["id"], len(line["embedding"])) for line in lines] == [
        (0, "first document", 384), (1, "second document", 384)]
