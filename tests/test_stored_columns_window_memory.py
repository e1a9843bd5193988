"""Bounded memory (RELIABILITY.md promise 9) in the stored-columns phase of ``petal index``: the text and
``--keep-columns`` stored beside the ids (the entry's side file, the version's ``ids.parquet``) are read and written
a batch of the read window at a time (``ReadConfig.max_batch_bytes / 8``), whatever the documents' size.
Before, both were read in record batches of the whole budget (64 MB), each held several times over (the batch, the
rows taken from it, the next batch read while the writer held the last): one shard of 2000 x 100 KB documents took
~580 MB over a tiny run's peak, ~470 MB of it after the embedding.

Measured as the peak RSS (VmHWM) of real ``petal index`` processes (the tests' fake engine), as
tests/test_read_window_memory.py measures the read window; no timing is asserted."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.config import ReadConfig
from tests.fake_engine import fake_engine_factory, make_fake_model_dir
from tests.test_read_window_memory import long_documents, peak_rss

MB = 1 << 20
BUDGET = ReadConfig().max_batch_bytes


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def test_long_documents_text_is_stored_within_the_budget(tmp_path, model):
    (tmp_path / "tiny").mkdir()
    pq.write_table(long_documents(10, 1000), tmp_path / "tiny" / "a.parquet")
    (tmp_path / "big").mkdir()
    pq.write_table(long_documents(2000, 100_000), tmp_path / "big" / "a.parquet", write_batch_size=16)  # 200 MB
    baseline = peak_rss(tmp_path / "tiny", tmp_path / "out-tiny", model, stop=False)
    embedded = peak_rss(tmp_path / "big", tmp_path / "out-embedded", model)  # stopped before the text is stored
    peak = peak_rss(tmp_path / "big", tmp_path / "out-big", model, stop=False)
    stored = peak - embedded
    assert stored < 2 * BUDGET, (f"storing the text took {stored / MB:.0f} MB over the embedding's peak "
                                 f"({embedded / MB:.0f} MB), more than 2 x the {BUDGET / MB:.0f} MB budget")
    grown = peak - baseline
    assert grown < 4 * BUDGET, (f"petal index took {grown / MB:.0f} MB over a tiny run's peak "
                                f"({baseline / MB:.0f} MB), more than 4 x the {BUDGET / MB:.0f} MB budget")


def test_the_stored_columns_are_the_shard_s_values(tmp_path, model):
    sizes = [50, 100_000, 10, 30_000, 200_000, 7, 5_000, 9_000_000] * 5  # one value larger than a window batch
    table = long_documents(len(sizes), 200_000)
    texts = [(t * 50)[:n] for t, n in zip(table.column("text").to_pylist(), sizes)]
    table = table.set_column(1, "text", pa.array(texts))
    table = table.append_column("meta", pa.array([t[::-1] if i % 3 else None for i, t in enumerate(texts)]))
    table = table.append_column("n", pa.array(range(len(sizes)), pa.int32()))
    (tmp_path / "data").mkdir()
    pq.write_table(table, tmp_path / "data" / "a.parquet", row_group_size=9)
    expected = table.rename_columns(["id", "text", "meta", "n"])
    for name, budget in (("whole", 1 << 40), ("rows", 1), ("default", None)):
        out = tmp_path / name
        settings = {} if budget is None else {"max_batch_bytes": budget}
        petal.index([tmp_path / "data"], out=out, model=model, quiet=True, keep_columns=["meta", "n"],
                    engine_factory=fake_engine_factory(None), **settings)
        version = out / "versions" / (out / "CURRENT").read_text().strip()
        ids = pq.read_table(version / "ids.parquet")
        assert ids.column("faiss_id").to_pylist() == list(range(len(sizes)))
        assert ids.column("row").to_pylist() == list(range(len(sizes)))
        assert ids.select(["id", "text", "meta", "n"]).cast(expected.schema).equals(expected), name
        side = list((out / "store" / "columns").rglob("*.parquet"))
        assert len(side) == 1
        stored = pq.read_table(side[0])
        assert stored.column("row").to_pylist() == list(range(len(sizes)))
        assert stored.select(["text", "meta", "n"]).cast(expected.select(["text", "meta", "n"]).schema).equals(
            expected.select(["text", "meta", "n"])), name


def test_the_stored_columns_are_read_within_the_run_s_own_budget(tmp_path, model):
    """``max_batch_bytes=`` of the call bounds the stored-columns phase too: the version's ids.parquet is written a
    batch of the side file at a time (one row group each), each an eighth of the budget (at least one row).

    NOTE: the side files were read for ids.parquet in batches of the default budget's, whatever the call's."""
    (tmp_path / "data").mkdir()
    pq.write_table(long_documents(200, 100_000), tmp_path / "data" / "a.parquet", write_batch_size=16)  # 20 MB
    budget = 8 * MB
    petal.index([tmp_path / "data"], out=tmp_path / "out", model=model, quiet=True, max_batch_bytes=budget,
                engine_factory=fake_engine_factory(None))
    version = tmp_path / "out" / "versions" / (tmp_path / "out" / "CURRENT").read_text().strip()
    for path in (version / "ids.parquet", *(tmp_path / "out" / "store" / "columns").rglob("*.parquet")):
        meta = pq.ParquetFile(path).metadata
        text = meta.schema.names.index("text")
        largest = max(meta.row_group(g).column(text).total_uncompressed_size for g in range(meta.num_row_groups))
        assert largest <= budget // 8 + 100_000, f"{path.name}: a row group of {largest / MB:.1f} MB of text"
