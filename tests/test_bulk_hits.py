"""Hits resolved in bulk (``IdMap.lookup``, ``IndexReader._hits``): every search's [nq, k] FAISS labels at once,
equal to a per-hit reference on real indexes of precomputed vectors (``petal index --vectors-column``, Flat): string
and integer ids, two shards, deleted rows, more than one row group of ``ids.parquet``, kept columns, -1 labels and
short results (``--where``), and the JSON lines of ``petal query --vector-file``."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.cli.common import float32_value
from petal.pipeline.index.files import IDS_GROUP_ROWS
from petal.pipeline.index.row_groups import PER_VALUE_HITS
from petal.pipeline.index.search import Hit, IndexReader

DIM = 4
SIZES = {"a": 20000, "b": 15000}  # 35000 rows: ids.parquet holds three row groups (IDS_GROUP_ROWS 16384)
DELETED = [5, 16390, 20000, 20001, 34999]


def petal(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "import sys; from petal.cli.main import main; sys.exit(main())",
                           *argv], capture_output=True, text=True, check=False, timeout=300)


def build(tmp, string_ids: bool):
    rng = np.random.default_rng(7)
    offset = 0
    shards = []
    for name, n in SIZES.items():
        numbers = range(offset, offset + n)
        table = pa.table({
            "id": [f"doc-{i}" for i in numbers] if string_ids else list(numbers),
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * DIM).astype(np.float32)), DIM),
            "lang": ["en" if i % 3 else "fr" for i in numbers],
            "rare": [i % 5000 == 1 for i in numbers],  # 7 rows (one deleted): a k of 8 is short
            "text": [f"text of {i}" for i in numbers]})
        pq.write_table(table, tmp / f"{name}.parquet")
        shards.append(str(tmp / f"{name}.parquet"))
        offset += n
    deleted = [f"doc-{i}" for i in DELETED] if string_ids else DELETED
    pq.write_table(pa.table({"id": deleted}), tmp / "deleted.parquet")
    done = petal("index", *shards, "--out", str(tmp / "out"), "-q", "--vectors-column", "emb", "--index-factory",
                 "Flat", "--keep-columns", "lang,rare", "--delete", str(tmp / "deleted.parquet"))
    assert done.returncode == 0, done.stderr
    return tmp / "out"


@pytest.fixture(scope="module", params=["string ids", "int ids"])
def index(request, tmp_path_factory):
    out = build(tmp_path_factory.mktemp("bulk"), request.param == "string ids")
    reader = IndexReader(out)
    yield out, reader, Reference(reader, request.param == "string ids")
    reader.close()


class Reference:
    """Per hit, from the whole id map and stored columns read at once (``ParquetFile.read``), checked against the
    rows the shards were written with."""

    def __init__(self, reader: IndexReader, string_ids: bool) -> None:
        table = pq.read_table(reader.dir / "ids.parquet")
        self.rows = table.to_pylist()
        assert [r["faiss_id"] for r in self.rows] == list(range(len(self.rows)))
        kept = [i for i in range(sum(SIZES.values())) if i not in DELETED]
        assert len(self.rows) == len(kept) == reader.ntotal
        for row, number in zip(self.rows, kept):
            assert row["id"] == (f"doc-{number}" if string_ids else number)
            assert row["shard"].endswith("a.parquet" if number < SIZES["a"] else "b.parquet")
            assert row["row"] == (number if number < SIZES["a"] else number - SIZES["a"])
        assert pq.ParquetFile(reader.dir / "ids.parquet").metadata.num_row_groups >= 3

    def lookup(self, labels: np.ndarray) -> tuple[list, list, list]:
        found = [self.rows[int(label)] for label in labels.ravel()]
        return [r["id"] for r in found], [r["shard"] for r in found], [r["row"] for r in found]

    def hits(self, scores: np.ndarray, labels: np.ndarray) -> list[list[Hit]]:
        out = []
        for q in range(labels.shape[0]):
            hits = []
            for rank in range(labels.shape[1]):
                label = int(labels[q, rank])
                if label < 0:
                    continue
                row = self.rows[label]
                hits.append(Hit(rank + 1, float(scores[q, rank]), label, row["id"], row["shard"], row["row"],
                                {"lang": row["lang"], "rare": row["rare"]}))
            out.append(hits)
        return out


def edge_labels(n: int) -> np.ndarray:
    """FAISS ids at the edges: first and last, each side of every row group's start and of the second shard's."""
    second = SIZES["a"] - sum(1 for d in DELETED if d < SIZES["a"])
    edges = [0, 1, n - 1, n - 2, second - 1, second, second + 1]
    for start in range(IDS_GROUP_ROWS, n, IDS_GROUP_ROWS):
        edges += [start - 1, start, start + 1]
    return np.array(edges, dtype=np.int64)


def random_labels(rng: np.random.Generator, n: int, shape: tuple[int, int]) -> np.ndarray:
    labels = rng.integers(0, n, size=shape)
    edges = edge_labels(n)
    at = rng.random(shape) < 0.3
    labels[at] = rng.choice(edges, size=int(at.sum()))
    labels[rng.random(shape) < 0.15] = -1  # FAISS pads a short result with -1
    short = rng.random(shape[0]) < 0.2
    labels[short, shape[1] // 2:] = -1  # whole short rows, as a filtered search returns
    return labels


def test_bulk_lookup_equals_per_hit_reference(index):
    _, reader, reference = index
    rng = np.random.default_rng(11)
    n = reader.ntotal
    shapes = [(1, 1), (1, 8), (3, 16), (PER_VALUE_HITS, 1), (PER_VALUE_HITS + 1, 1), (7, 10), (200, 8), (2000, 5)]
    for trial in range(40):
        labels = random_labels(rng, n, shapes[trial % len(shapes)])
        valid = labels[labels >= 0]
        assert reader.id_map.lookup(valid) == reference.lookup(valid), (trial, labels.shape)
    for labels in (edge_labels(n), edge_labels(n)[::-1], np.repeat(edge_labels(n), 9),
                   np.sort(rng.integers(0, n, 500)), np.arange(n), np.zeros(0, dtype=np.int64)):
        assert reader.id_map.lookup(labels) == reference.lookup(labels)


def test_hits_of_random_label_arrays_equal_per_hit_reference(index):
    _, reader, reference = index
    rng = np.random.default_rng(12)
    for trial in range(30):
        shape = [(1, 10), (5, 8), (300, 8), (40, 1), (1000, 3)][trial % 5]
        labels = random_labels(rng, reader.ntotal, shape)
        scores = np.where(labels >= 0, rng.standard_normal(shape), -3.4e38).astype(np.float32)
        got = reader._hits(scores, labels, labels >= 0, labels[labels >= 0])
        assert got == reference.hits(scores, labels), trial
        assert all(type(hit.score) is float and type(hit.faiss_id) is int for hits in got for hit in hits)


@pytest.mark.parametrize("where", [None, "lang = 'en'", "rare = true"])
def test_search_equals_faiss_labels_resolved_per_hit(index, where):
    _, reader, reference = index
    queries = np.random.default_rng(13).standard_normal((300, DIM)).astype(np.float32)
    k = 8
    if where is None:
        scores, labels = reader.index.search(queries, k)
    else:
        params = reader.selector(where).params(reader.index, reader.search_params)
        scores, labels = reader.index.search(queries, k, params=params)
    expected = reference.hits(scores, labels)
    assert reader.search(queries, k, where=where) == expected
    if where == "rare = true":  # 6 rows match: every answer is short, padded by FAISS with -1
        assert (labels < 0).any() and all(len(hits) == 6 for hits in expected)


def test_query_vector_file_json_lines_are_the_per_hit_reference(index, tmp_path):
    out, reader, reference = index
    queries = np.random.default_rng(14).standard_normal((120, DIM)).astype(np.float32)
    np.save(tmp_path / "q.npy", queries)
    for where in (None, "rare = true"):
        flags = [] if where is None else ["--where", where]
        done = petal("query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "8", "--json", "--show-text",
                     *flags)
        assert done.returncode == 0, done.stderr
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        params = None if where is None else reader.selector(where).params(reader.index, reader.search_params)
        scores, labels = reader.index.search(queries, 8, params=params)
        expected = reference.hits(scores, labels)
        assert [line["query"] for line in lines] == [f"vector {i}" for i in range(len(queries))]
        for line, hits in zip(lines, expected):
            assert line["hits"] == [{"rank": h.rank, "score": float32_value(h.score), "id": h.id, "shard": h.shard,
                                     "row": h.row, "fields": h.fields, "text": reference.rows[h.faiss_id]["text"]}
                                    for h in hits]
