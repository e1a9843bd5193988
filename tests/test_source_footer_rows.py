"""A source whose Parquet footer counts more rows than its pages hold (an edited or damaged file) is bad input, 65
naming the shard, nothing published and no store entry committed. Before: ``petal index`` embedded the rows there
were and published, exit 0, the manifest counting the footer's rows with the missing ones in no count (rows 1000,
embedded 3, skipped none).

Real Parquet files whose footers are edited in place (the row counts of the thrift footer rewritten), real
``petal`` processes: the packaged MiniLM for a text run, a ``--vectors-column`` run without a model.
"""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO


def _varint(b: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = b[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _skip(b: bytes, i: int, kind: int, path: tuple, i64s: list) -> int:
    """Walk one thrift compact value of ``kind`` at ``i``; the (path, start, end) of each i64 into ``i64s``."""
    if kind in (1, 2):
        return i
    if kind == 3:
        return i + 1
    if kind in (4, 5, 6):
        start = i
        _, i = _varint(b, i)
        if kind == 6:
            i64s.append((path, start, i))
        return i
    if kind == 7:
        return i + 8
    if kind == 8:
        n, i = _varint(b, i)
        return i + n
    if kind in (9, 10):
        head = b[i]
        i += 1
        n, item = head >> 4, head & 0x0F
        if n == 15:
            n, i = _varint(b, i)
        for k in range(n):
            i = _skip(b, i, item, (*path, k), i64s)
        return i
    assert kind == 12, kind
    field = 0
    while True:
        head = b[i]
        i += 1
        if head == 0:
            return i
        if head >> 4:
            field += head >> 4
        else:
            zz, i = _varint(b, i)
            field = (zz >> 1) ^ -(zz & 1)
        i = _skip(b, i, head & 0x0F, (*path, field), i64s)


def claim_rows(path: Path, rows: int) -> None:
    """Rewrite ``path``'s footer so that the file and its (one) row group count ``rows`` rows."""
    data = path.read_bytes()
    length = struct.unpack("<I", data[-8:-4])[0]
    footer = bytearray(data[-8 - length:-8])
    i64s: list = []
    _skip(bytes(footer), 0, 12, (), i64s)
    # FileMetaData.num_rows (field 3), RowGroup.num_rows (row_groups field 4, each its field 3)
    spots = [(a, b) for p, a, b in i64s if p == (3,) or (len(p) == 3 and p[0] == 4 and p[2] == 3)]
    zigzag, encoded = rows << 1, bytearray()
    while True:
        encoded.append((zigzag & 0x7F) | (0x80 if zigzag >> 7 else 0))
        zigzag >>= 7
        if not zigzag:
            break
    for a, b in sorted(spots, reverse=True):
        footer[a:b] = encoded
    path.write_bytes(data[:-8 - length] + bytes(footer) + struct.pack("<I", len(footer)) + b"PAR1")
    assert pq.read_metadata(path).num_rows == rows and pq.read_metadata(path).row_group(0).num_rows == rows


def petal(*argv: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *map(str, argv)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


@pytest.mark.parametrize("kind", ["text", "vectors"])
def test_a_footer_counting_rows_its_pages_lack_is_65_naming_the_shard(tmp_path, kind):
    if kind == "text":
        table = pa.table({"id": ["a", "b", "c"], "text": ["glaciers move", "rivers flow", "sand drifts"]})
        flags: list[str] = ["-q"]
    else:
        flat = np.random.default_rng(0).standard_normal(3 * 8).astype(np.float32)
        table = pa.table({"id": [1, 2, 3], "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), 8)})
        flags = ["-q", "--vectors-column", "emb"]
    shard = tmp_path / "src" / "shard.parquet"
    shard.parent.mkdir()
    pq.write_table(table, shard)
    claim_rows(shard, 1000)
    out = tmp_path / "out"
    proc = petal("index", shard.parent, "--out", out, *flags)
    assert proc.returncode == 65, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert str(shard) in last and "footer counts 1,000 rows" in last and "pages hold 3" in last, last
    assert "Traceback" not in proc.stderr
    assert not (out / "CURRENT").exists()
    assert not list((out / "store" / "shards").glob("*/*"))
    assert not list((out / "store" / "tmp").iterdir())


def test_a_footer_counting_more_rows_than_the_disk_holds_names_the_shard_and_the_count(tmp_path):
    """The store entry's space is reserved from the footer's count before a page is read: a footer that claims
    2**40 rows is 74 as a full disk is, but says what was asked for and whose footer asked (before: 'cannot write
    .../embeddings.npy: Invalid argument', no word of the shard); nothing is left in the store."""
    flat = np.random.default_rng(0).standard_normal(3 * 8).astype(np.float32)
    shard = tmp_path / "src" / "shard.parquet"
    shard.parent.mkdir()
    pq.write_table(pa.table({"id": [1, 2, 3], "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), 8)}), shard)
    claim_rows(shard, 1 << 40)
    out = tmp_path / "out"
    proc = petal("index", shard.parent, "--out", out, "-q", "--vectors-column", "emb")
    assert proc.returncode == 74, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert f"the {1 << 40:,} rows the footer of {shard} counts" in last, last
    assert "Traceback" not in proc.stderr and not (out / "CURRENT").exists()
    assert not list((out / "store" / "tmp").iterdir())
