"""``--keep-columns`` types are checked against the shards a run keeps from the live version before any work, as
README says. Before: a named shard whose kept column's type does not widen with a kept shard's (``lang`` int64
beside a kept shard's string) was embedded (and its model loaded) and only then refused, 65, when the version's
columns were merged; text and ``--vectors-column`` runs alike. Now it is 65 before the model loads and before
any shard is read for rows, naming both shards; types that widen (int32 and int64) still index."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_cli import invoke
from tests.fake_engine import make_fake_model_dir, read_log

FAKE = "PETAL_TEST_FAKE_ENGINE"


def shard(path: Path, first_id: int, lang: pa.Array) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = len(lang)
    pq.write_table(pa.table({"id": list(range(first_id, first_id + n)), "text": [f"text {i}" for i in range(n)],
                             "lang": lang, "emb": pa.array([[1.0, float(i)] for i in range(n)],
                                                           pa.list_(pa.float32()))}), path)
    return path


def index(tmp_path: Path, src: Path, vectors: bool):
    flags = ["--vectors-column", "emb"] if vectors else ["--model", str(make_fake_model_dir(tmp_path / "model"))]
    return invoke(["index", str(src), "--out", str(tmp_path / "out"), "-q", "--keep-columns", "lang", *flags],
                  env={FAKE: str(tmp_path / "fake.log")})


@pytest.mark.parametrize("vectors", [False, True], ids=["text", "vectors-column"])
def test_a_kept_column_of_another_type_than_a_kept_shards_is_refused_before_any_work(tmp_path, vectors):
    a = shard(tmp_path / "src" / "a.parquet", 0, pa.array(["en", "fr"]))
    assert index(tmp_path, a, vectors).exit_code == 0
    (tmp_path / "fake.log").unlink(missing_ok=True)
    current = (tmp_path / "out" / "CURRENT").read_text()
    b = shard(tmp_path / "src" / "b.parquet", 10, pa.array([1, 2], pa.int64()))
    result = index(tmp_path, b, vectors)  # additive: a is kept
    assert result.exit_code == 65, result.output
    assert "--keep-columns 'lang'" in result.output and "a.parquet" in result.output and "b.parquet" in result.output
    assert read_log(tmp_path / "fake.log") == []  # no model loaded, nothing embedded
    assert len(list((tmp_path / "out" / "store" / "shards").glob("*/*/rows.parquet"))) == 1  # a's entry only
    assert (tmp_path / "out" / "CURRENT").read_text() == current


@pytest.mark.parametrize("vectors", [False, True], ids=["text", "vectors-column"])
def test_kept_column_types_that_widen_still_index(tmp_path, vectors):
    a = shard(tmp_path / "src" / "a.parquet", 0, pa.array([1, 2], pa.int32()))
    assert index(tmp_path, a, vectors).exit_code == 0
    b = shard(tmp_path / "src" / "b.parquet", 10, pa.array([3, 4], pa.int64()))
    result = index(tmp_path, b, vectors)
    assert result.exit_code == 0, result.output


def plain_shard(path: Path, first_id: int, lang: list[str] | None) -> Path:
    columns: dict = {"id": [first_id, first_id + 1], "text": ["text a", "text b"]}
    if lang is not None:
        columns["lang"] = lang
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def test_a_kept_shard_without_the_column_is_refused_before_any_work(tmp_path):
    """Before: a KeyError traceback (exit 1) once the new shard was embedded."""
    a = plain_shard(tmp_path / "src" / "a.parquet", 0, None)  # indexed before --keep-columns named lang
    model = ["--model", str(make_fake_model_dir(tmp_path / "model"))]
    env = {FAKE: str(tmp_path / "fake.log")}
    assert invoke(["index", str(a), "--out", str(tmp_path / "out"), "-q", *model], env=env).exit_code == 0
    (tmp_path / "fake.log").unlink()
    b = plain_shard(tmp_path / "src" / "b.parquet", 10, ["en", "fr"])
    args = ["index", str(b), "--out", str(tmp_path / "out"), "-q", "--keep-columns", "lang", *model]
    result = invoke(args, env=env)
    assert result.exit_code == 65, result.output
    assert "a.parquet (kept from the live version): no column 'lang'" in result.output
    assert read_log(tmp_path / "fake.log") == []
    a.unlink()  # gone: its columns cannot be stored (78), said before any embedding too
    result = invoke(args, env=env)
    assert result.exit_code == 78, result.output
    assert "a.parquet is gone or changed since it was embedded" in result.output
    assert read_log(tmp_path / "fake.log") == []
    plain_shard(a, 0, ["de", "it"])  # back, with the column: its side file is written from it
    assert invoke(["index", str(a), str(b), "--out", str(tmp_path / "out"), "-q", "--keep-columns", "lang", *model],
                  env=env).exit_code == 0


def test_a_kept_shard_whose_file_has_the_column_gets_it_stored(tmp_path):
    a = plain_shard(tmp_path / "src" / "a.parquet", 0, ["de", "it"])
    model = ["--model", str(make_fake_model_dir(tmp_path / "model"))]
    env = {FAKE: str(tmp_path / "fake.log")}
    assert invoke(["index", str(a), "--out", str(tmp_path / "out"), "-q", *model], env=env).exit_code == 0
    b = plain_shard(tmp_path / "src" / "b.parquet", 10, ["en", "fr"])
    result = invoke(["index", str(b), "--out", str(tmp_path / "out"), "-q", "--keep-columns", "lang", *model], env=env)
    assert result.exit_code == 0, result.output
    import numpy as np

    import petal

    with petal.open_index(str(tmp_path / "out")) as index:
        hits = index.search_stored(np.ones((1, index.info["dim"]), "float32"), k=10)[0]
        assert sorted((h.id, h.fields["lang"]) for h in hits) == [(0, "de"), (1, "it"), (10, "en"), (11, "fr")]
