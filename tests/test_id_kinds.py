"""An index holds one kind of id. Before: only the shards a text run named were checked against each other, so the
kinds mixed silently elsewhere, and integer ids were stored as strings (``7`` came back as ``"7"``, and was taken
for the string id ``"7"`` of another shard: superseded): a shard kept from the live version beside a named shard of
the other kind (text and ``--vectors-column`` runs), named ``--vectors-column`` shards of both kinds, and integer ids
beside a shard without an id column (``<shard>:<row>`` strings). Now each is 65 naming the shards, before any
embedding, and the live version stays."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_cli import invoke

FAKE = "PETAL_TEST_FAKE_ENGINE"


def shard(path: Path, ids: list | None, vectors: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 2 if ids is None else len(ids)
    columns: dict = {} if ids is None else {"id": ids}
    columns["text"] = [f"{path.stem} text {i}" for i in range(n)]
    if vectors:
        columns["emb"] = pa.array([[1.0, float(i)] for i in range(n)], pa.list_(pa.float32()))
    pq.write_table(pa.table(columns), path)
    return path


def index(tmp_path: Path, *args: str | Path, model: Path | None = None):
    extra = ["--model", str(model)] if model is not None else []
    return invoke(["index", *map(str, args), "--out", str(tmp_path / "out"), "-q", *extra],
                  env={FAKE: str(tmp_path / "fake.log")})


@pytest.fixture
def fake_model(tmp_path):
    from tests.fake_engine import make_fake_model_dir

    return make_fake_model_dir(tmp_path / "model")


def live_ids(tmp_path: Path) -> list:
    import petal

    with petal.open_index(str(tmp_path / "out")) as index:
        import numpy as np

        hits = index.search_stored(np.ones((1, index.info["dim"]), "float32"), k=100)[0]
        return sorted((type(h.id).__name__, str(h.id)) for h in hits)


@pytest.mark.parametrize("vectors", [False, True], ids=["text", "vectors-column"])
@pytest.mark.parametrize("first, second", [([1, 2], ["x", "2"]), (["x", "y"], [2, 3])], ids=["int-then-str",
                                                                                              "str-then-int"])
def test_a_named_shard_of_the_other_kind_than_a_kept_one_is_refused(tmp_path, fake_model, vectors, first, second):
    flags = ["--vectors-column", "emb"] if vectors else []
    model = None if vectors else fake_model
    a = shard(tmp_path / "src" / "a.parquet", first, vectors)
    b = shard(tmp_path / "src" / "b.parquet", first[:1] if isinstance(first[0], int) else ["z"], vectors)
    assert index(tmp_path, a, b, *flags, model=model).exit_code == 0
    before = live_ids(tmp_path)
    shard(b, second, vectors)  # b now holds ids of the other kind; a is kept (additive)
    result = index(tmp_path, b, *flags, model=model)
    assert result.exit_code == 65, result.output
    assert "is an integer in some shards and a string in others" in result.output
    assert "a.parquet" in result.output and "kept from the live version" in result.output
    assert live_ids(tmp_path) == before
    # naming every shard with --sync changes the kind of the whole index
    shard(a, [f"s{i}" for i in range(2)] if isinstance(second[0], str) else [7, 8], vectors)
    assert index(tmp_path, a, b, *flags, "--sync", "--max-removed", "100%", model=model).exit_code == 0
    assert len({kind for kind, _ in live_ids(tmp_path)}) == 1


def test_vectors_column_shards_of_both_kinds_are_refused_before_any_work(tmp_path):
    a = shard(tmp_path / "src" / "a.parquet", [1, 2], vectors=True)
    b = shard(tmp_path / "src" / "b.parquet", ["x", "2"], vectors=True)
    result = index(tmp_path, a, b, "--vectors-column", "emb")
    assert result.exit_code == 65, result.output
    assert "is an integer in some shards and a string in others" in result.output
    assert not (tmp_path / "out" / "CURRENT").exists()


def test_integer_ids_beside_a_shard_without_ids_are_refused(tmp_path, fake_model):
    a = shard(tmp_path / "src" / "a.parquet", [1, 2])
    b = shard(tmp_path / "src" / "b.parquet", None)
    result = index(tmp_path, a, b, model=fake_model)
    assert result.exit_code == 65, result.output
    assert "b.parquet (no id column" in result.output
    assert not (tmp_path / "fake.log").exists() or "load" not in (tmp_path / "fake.log").read_text()
    # string ids beside synthesized ones are one kind
    shard(a, ["p", "q"])
    assert index(tmp_path, a, b, model=fake_model).exit_code == 0
