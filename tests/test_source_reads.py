"""Every read of a source shard in a run goes through the readers that retry OS errors and judge the rest (an OS
read error retried then 74, permission denied 66, a corrupt page 65 naming file, row group and column): not only the
footers and the rows, but the ``--keep-columns`` check, the uint64 id range check and ``--strict``'s cross-shard
duplicate check. Before: the keep-columns check opened every shard again with a bare ``ParquetFile`` (an EIO was 74
at once, never retried), the id range and duplicate checks read the whole id column with a bare ``read_table`` (no
retry; a corrupt page named no row group; ``--strict`` on object-storage shards was a ``TypeError``: exit 1)."""

from __future__ import annotations

import builtins
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.fake_cli import fake_hooks
from tests.fake_engine import make_fake_model_dir, read_log
from tests.test_vectors_read_errors import run

ROWS, GROUP = 400, 100
RETRYING = {"_retrying", "stream_batches"}  # pipeline/ingest/parquet.py: the judged readers


def shard(path: Path, first_id: int, statistics: bool = True, checksums: bool = False) -> Path:
    """uint64 ids (``statistics=False``: no min/max in the footer, so preflight reads the id column), text, lang."""
    ids = pa.array(range(first_id, first_id + ROWS), pa.uint64())
    table = pa.table({"id": ids, "text": [f"document {i} about glaciers" for i in range(first_id, first_id + ROWS)],
                      "lang": [f"lang-{i % 5}" for i in range(ROWS)],
                      "emb": pa.array([[float(i % 7), 1.0, 2.0, 3.0] for i in range(ROWS)], pa.list_(pa.float32()))})
    pq.write_table(table, path, row_group_size=GROUP, write_statistics=statistics, compression="none",
                   use_dictionary=False, write_page_checksum=checksums)
    return path


class SourceSpy:
    """Records each open of a file under ``root`` by pyarrow's readers or ``open()``, and whether a judged reader
    (``RETRYING``) was on the stack. The real functions run."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root, self.bare, self.judged = str(root), [], 0
        for name in ("read_table", "read_schema", "read_metadata"):
            monkeypatch.setattr(pq, name, self.wrap(getattr(pq, name), name))
        init = pq.ParquetFile.__init__
        monkeypatch.setattr(pq.ParquetFile, "__init__", self.wrap(init, "ParquetFile", skip_self=True))
        monkeypatch.setattr(builtins, "open", self.wrap(builtins.open, "open"))

    def wrap(self, real, name: str, skip_self: bool = False):
        def spy(*args, **kwargs):
            source = args[1] if skip_self else (args[0] if args else kwargs.get("source"))
            if isinstance(source, (str, Path)) and str(source).startswith(self.root):
                frame, judged = sys._getframe(1), False
                while frame is not None and not judged:
                    judged = frame.f_code.co_name in RETRYING and frame.f_code.co_filename.endswith("parquet.py")
                    frame = frame.f_back
                if judged:
                    self.judged += 1
                else:
                    self.bare.append(f"{name}({Path(source).name}) from {sys._getframe(1).f_code.co_name}")
            return real(*args, **kwargs)
        return spy


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    shard(path / "a.parquet", 0, statistics=False)
    shard(path / "b.parquet", 1000, statistics=False)
    return path


def test_every_read_of_a_source_in_a_text_run_is_judged(data, tmp_path, monkeypatch):
    model = make_fake_model_dir(tmp_path / "model")
    spy = SourceSpy(data, monkeypatch)
    rc, stderr, _ = run(data, "--out", tmp_path / "out", "--model", model, "--keep-columns", "lang",
                             "--strict", report=tmp_path / "r.json", monkeypatch=monkeypatch,
                             obj=fake_hooks(tmp_path / "fake.jsonl"))
    assert rc == 0, stderr
    assert spy.judged and spy.bare == [], spy.bare


def test_every_read_of_a_source_in_a_vectors_run_is_judged(data, tmp_path, monkeypatch):
    spy = SourceSpy(data, monkeypatch)
    rc, stderr, _ = run(data, "--out", tmp_path / "out", "--vectors-column", "emb", "--keep-columns", "lang",
                             report=tmp_path / "r.json", monkeypatch=monkeypatch)
    assert rc == 0, stderr
    assert spy.judged and spy.bare == [], spy.bare


def test_a_read_error_in_the_id_range_check_is_retried_then_74_before_the_model_loads(data, tmp_path, monkeypatch):
    model, log = make_fake_model_dir(tmp_path / "model"), tmp_path / "fake.jsonl"
    args = (data, "--out", tmp_path / "out", "--model", model)
    rc, stderr, report = run(*args, fault="read_batch:1:eio", report=tmp_path / "r.json", monkeypatch=monkeypatch,
                             obj=fake_hooks(log))
    assert rc == 0 and report["retries"]["read"] == 1, stderr  # one EIO, retried
    rc, stderr, report = run(*args, "--full", fault="read_batch:1+:eio", report=tmp_path / "r.json",
                             monkeypatch=monkeypatch, obj=fake_hooks(tmp_path / "second.jsonl"))
    assert rc == 74 and "a.parquet: read error after 3 retries" in stderr, stderr
    assert report["exit_code"] == 74 and report["retries"]["read"] == 0  # none recovered
    assert "recovered" not in stderr.strip().splitlines()[-1], stderr
    assert read_log(tmp_path / "second.jsonl") == []  # preflight: no engine was made


def test_a_corrupt_page_of_the_id_column_is_65_naming_row_group_and_column(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    bad = shard(data / "a.parquet", 0, statistics=False, checksums=True)
    meta = pq.read_metadata(bad)
    chunk = meta.row_group(2).column(0)
    raw = bytearray(bad.read_bytes())
    at = chunk.data_page_offset + chunk.total_compressed_size - 16  # inside the values: the page CRC fails
    raw[at:at + 8] = b"\x7f\xff\x00\xff\x13\x80\xff\xee"
    bad.write_bytes(bytes(raw))
    rc, stderr, report = run(bad, "--out", tmp_path / "out", "--model", make_fake_model_dir(tmp_path / "model"),
                             report=tmp_path / "r.json", monkeypatch=monkeypatch,
                             obj=fake_hooks(tmp_path / "fake.jsonl"))
    first = meta.row_group(0).num_rows + meta.row_group(1).num_rows  # row group 2's first row, not its batch's
    assert rc == 65 and f"a.parquet: cannot read rows from row {first} (row group 2, column 'id'): corrupt data" \
        in stderr, stderr
    assert report["exit_code"] == 65 and read_log(tmp_path / "fake.jsonl") == []


def test_an_id_above_int64_without_statistics_is_still_found(tmp_path, monkeypatch):
    path = tmp_path / "big.parquet"
    ids = pa.array([1, 2, 2**63 + 5, 4], pa.uint64())
    pq.write_table(pa.table({"id": ids, "text": ["a", "b", "c", "d"]}), path, write_statistics=False,
                   row_group_size=2)
    rc, stderr, _ = run(path, "--out", tmp_path / "out", "--model", make_fake_model_dir(tmp_path / "model"),
                        report=tmp_path / "r.json", monkeypatch=monkeypatch, obj=fake_hooks(tmp_path / "f.jsonl"))
    assert rc == 65 and f"holds {2**63 + 5} at row 2" in stderr, stderr


def test_strict_reads_the_ids_of_object_storage_shards(tmp_path):
    """``--strict`` over ``s3://`` shards: the cross-shard duplicate check reads each object's ids by ranged reads
    (before: ``read_table`` of the object's path, a ``TypeError``, exit 1 with a traceback)."""
    pytest.importorskip("moto")
    import io

    from tests.fake_cli import invoke
    from tests.s3_server import start_s3

    s3 = start_s3(tmp_path / "moto.log")
    try:
        s3.client().create_bucket(Bucket="corpus")
        for name, ids in (("a", ["x-1", "x-2", "both"]), ("b", ["y-1", "both"])):
            buffer = io.BytesIO()
            pq.write_table(pa.table({"id": ids, "text": [f"{name} text {i}" for i in ids]}), buffer)
            s3.client().put_object(Bucket="corpus", Key=f"shards/{name}.parquet", Body=buffer.getvalue())
        env = {**s3.env(), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "fake.jsonl")}
        argv = ["index", "s3://corpus/shards", "--out", str(tmp_path / "out"), "-q", "--strict",
                "--model", str(make_fake_model_dir(tmp_path / "model"))]
        result = invoke(argv, env=env)
        assert result.exit_code == 65, result.output
        assert "id \"both\" in s3://corpus/shards/a.parquet and s3://corpus/shards/b.parquet" in result.stderr
        result = invoke(["index", "s3://corpus/shards/a.parquet", *argv[2:]], env=env)
        assert result.exit_code == 0, result.output
    finally:
        s3.stop()
