"""``petal embed --input FILE`` reads its file as ``petal index`` reads a shard: an OS read error (EIO) is retried
(backing off) and 74 when it persists, never taken for a bad file; a Parquet page that does not decode is 65 naming
the file, the row its batch starts at, the row group and the column; a dictionary-encoded (categorical) text column
is its values. Before: an EIO on a ``.parquet`` input was 65 ("not a readable Parquet file" / "cannot read
column(s)") at once, on a ``.txt`` or ``.jsonl`` a traceback. Real ``petal embed`` processes with the packaged
model; the EIO comes from the named fault points (pipeline/reliability/faults.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PETAL = str(Path(sys.executable).parent / "petal")
ROWS, GROUP = 60, 20  # 3 row groups


def embed(tmp_path: Path, source: Path, output: Path, fault: str | None = None, *args: str,
          trace: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PETAL_FAULT", "PETAL_FAULT_TRACE")}
    env["HF_HUB_OFFLINE"] = "1"
    if trace is not None:
        env["PETAL_FAULT_TRACE"] = str(trace)
    if fault:
        env["PETAL_FAULT"] = fault
    done = subprocess.run([PETAL, "embed", "--input", str(source), "--output", str(output), *args],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def shard(path: Path, dictionary: bool = False) -> Path:
    texts = pa.array([f"document {i} about glaciers and {i % 7} rivers" for i in range(ROWS)])
    pq.write_table(pa.table({"id": list(range(ROWS)), "text": texts.dictionary_encode() if dictionary else texts}),
                   path, row_group_size=GROUP, compression="none", use_dictionary=False, write_page_checksum=True)
    return path


def test_a_transient_read_error_is_retried_and_one_that_persists_is_74(tmp_path):
    source = shard(tmp_path / "in.parquet")
    clean = embed(tmp_path, source, tmp_path / "clean.npy")
    assert clean.returncode == 0, clean.stderr
    expected = np.load(tmp_path / "clean.npy")
    assert expected.shape[0] == ROWS
    for point in ("read_footer", "read_batch"):
        trace = tmp_path / f"{point}.trace"
        done = embed(tmp_path, source, tmp_path / f"{point}.npy", f"{point}:1:eio", trace=trace)
        assert done.returncode == 0, (point, done.stderr)
        assert trace.read_text().split().count(point) == 2  # failed once, read again
        np.testing.assert_array_equal(np.load(tmp_path / f"{point}.npy"), expected)
        done = embed(tmp_path, source, tmp_path / f"{point}-bad.npy", f"{point}:1+:eio")
        assert done.returncode == 74, (point, done.returncode, done.stderr)
        assert f"{source}: read error after 3 retries" in done.stderr and "not corrupt" in done.stderr, done.stderr
        assert not (tmp_path / f"{point}-bad.npy").exists()


def test_text_and_jsonl_inputs_retry_then_74(tmp_path):
    (tmp_path / "in.txt").write_text("first text\nsecond text\n")
    (tmp_path / "in.jsonl").write_text('{"text": "first text"}\n{"text": "second text"}\n')
    for name in ("in.txt", "in.jsonl"):
        source = tmp_path / name
        done = embed(tmp_path, source, tmp_path / f"{name}.npy", "read_batch:1:eio")
        assert done.returncode == 0, (name, done.stderr)
        assert np.load(tmp_path / f"{name}.npy").shape[0] == 2
        done = embed(tmp_path, source, tmp_path / f"{name}-bad.npy", "read_batch:1+:eio")
        assert done.returncode == 74 and f"{source}: read error after 3 retries" in done.stderr, (name, done.stderr)


def test_a_corrupt_page_is_65_naming_row_group_and_column(tmp_path):
    source = shard(tmp_path / "in.parquet")
    meta = pq.read_metadata(source)
    chunk = meta.row_group(2).column(1)  # text
    raw = bytearray(source.read_bytes())
    at = chunk.data_page_offset + chunk.total_compressed_size - 16  # inside the values: the page CRC fails
    raw[at:at + 8] = b"\x7f\xff\x00\xff\x13\x80\xff\xee"
    source.write_bytes(bytes(raw))
    done = embed(tmp_path, source, tmp_path / "out.npy")
    assert done.returncode == 65, done.stderr
    assert f"{source}: cannot read rows from row " in done.stderr \
        and "(row group 2, column 'text'): corrupt data" in done.stderr, done.stderr
    assert not (tmp_path / "out.npy").exists()


def test_a_dictionary_text_column_is_its_values(tmp_path):
    plain = embed(tmp_path, shard(tmp_path / "plain.parquet"), tmp_path / "plain.npy")
    coded = embed(tmp_path, shard(tmp_path / "coded.parquet", dictionary=True), tmp_path / "coded.npy")
    assert plain.returncode == 0 and coded.returncode == 0, coded.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "coded.npy"), np.load(tmp_path / "plain.npy"))
