"""The lengths ``index.faiss`` gives FAISS before it reads what they count, checked against the file, without FAISS.

FAISS reads most arrays of an index as a length, then ``resize(length)``, then the items (its ``READVECTOR``; a
length up to 2^40 items passes its own check), so a damaged length makes it allocate, and zero-fill, what the file
cannot hold before the read fails. The open checks (size, head/tail checksums) see the first and last MiB only:
a byte changed in the body of an index of ~100k vectors or more, where an HNSW graph's neighbour count or an IVF
index's list sizes lie, made one ``petal query`` grow to 12 GB of memory in 24 s, still growing when it was killed,
where it should be 65 naming the file. Memory-mapped reads (``IO_FLAG_MMAP_IFC``: codes, lists) are bounded by the
file; the plain ``READVECTOR``s are not.

``check_lengths`` walks the structure of the index types petal builds (flat, SQ, PQ, HNSW over them, IVF over a
flat or HNSW quantizer with in-memory or on-disk lists, pre-transforms, refine wrappers, and their binary
counterparts) reading only the lengths, a few bytes each (an IVF index's list-size table: O(lists)), and raises
``BadInputError`` (65) where a length counts more bytes than the file has left. At a type it does not know it
stops: what it cannot read is left to FAISS, as before.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO

from petal.pipeline.reliability.errors import BadInputError, quote_path

FLOAT_HEADER = struct.Struct("<iqqq?i")  # d, ntotal, two dummies, is_trained, metric_type (then metric_arg if > 1)
BINARY_HEADER = struct.Struct("<iiq?i")  # d, code_size, ntotal, is_trained, metric_type
FLAT = {b"IxFI", b"IxF2", b"IxFl"}
HNSW = {b"IHNf", b"IHNp", b"IHNs", b"IHN2"}
TRANSFORMS = {b"LTra", b"rrot"}


class _Stop(Exception):
    """A type the walk does not know: nothing past it is checked."""


class _Short(Exception):
    """A length counting more bytes than the file has left."""


class _Cursor:
    def __init__(self, fh: BinaryIO, size: int) -> None:
        self.fh = fh
        self.size = size
        self.pos = 0

    def take(self, count: int) -> bytes:
        if count > self.size - self.pos:
            raise _Short(f"{count} bytes at byte {self.pos}")
        data = self.fh.read(count)
        if len(data) != count:
            raise _Short(f"{count} bytes at byte {self.pos}")
        self.pos += count
        return data

    def skip(self, count: int, what: str) -> None:
        if count > self.size - self.pos:
            raise _Short(f"{what} of {count} bytes at byte {self.pos}, {self.size - self.pos} left")
        self.pos += count
        self.fh.seek(self.pos)

    def unpack(self, fmt: str) -> tuple[int, ...]:
        layout = struct.Struct("<" + fmt)
        return layout.unpack(self.take(layout.size))

    def vector(self, item: int, what: str) -> int:
        """A ``READVECTOR``: its length (items of ``item`` bytes), its items skipped; the length."""
        (count,) = self.unpack("Q")
        self.skip(count * item, f"{what} ({count} x {item} bytes)")
        return count


def check_lengths(path: Path) -> None:
    """``BadInputError`` (65) naming ``path`` when a length FAISS would allocate by before reading counts more bytes
    than the file holds (see the module's note); nothing when every length it knows fits."""
    try:
        walked(path)
    except OSError:  # NOTE: a file the host cannot open or read now: FAISS's read says so (74 or 65, read_errors.py)
        return
    except _Short as exc:
        raise BadInputError(f"{quote_path(path)}: FAISS cannot read it: a length inside it counts more than the file "
                            f"holds ({exc}); the index is corrupt, run petal verify and rebuild it") from None


def walked(path: Path) -> int | None:
    """How many bytes of ``path`` the walk of its structure read through (the file's size for an index whose every
    part it knows), ``None`` when it stopped at a part it does not know; ``_Short`` when a length does not fit."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        cursor = _Cursor(fh, os.fstat(fh.fileno()).st_size)
        binary = fh.read(2) == b"IB"
        fh.seek(0)
        try:
            (_binary_index if binary else _float_index)(cursor)
        except _Stop:
            return None
        return cursor.pos


def _header(cursor: _Cursor) -> None:
    metric = cursor.unpack(FLOAT_HEADER.format[1:])[-1]
    if metric > 1:
        cursor.take(4)


def _float_index(cursor: _Cursor) -> None:
    tag = cursor.take(4)
    if tag == b"null":
        return
    if tag in FLAT:
        _header(cursor)
        cursor.vector(4, "the vectors")  # read_xb_vector: floats
    elif tag == b"IxSQ":
        _header(cursor)
        _scalar_quantizer(cursor)
        cursor.vector(1, "the codes")
    elif tag in (b"IxPq", b"IxPQ", b"IxPo"):
        _header(cursor)
        _product_quantizer(cursor)
        cursor.vector(1, "the codes")
        if tag != b"IxPQ":
            cursor.unpack("i?i")  # search_type, encode_signs, polysemous_ht
    elif tag in HNSW:
        _header(cursor)
        _hnsw(cursor)
        _float_index(cursor)
    elif tag in (b"IwFl", b"IwSq", b"IwSQ", b"IwPQ"):
        _ivf_header(cursor)
        if tag in (b"IwSq", b"IwSQ"):
            _scalar_quantizer(cursor)
            cursor.unpack("Q")  # code_size
            if tag == b"IwSq":
                cursor.unpack("?")  # by_residual
        elif tag == b"IwPQ":
            cursor.unpack("?Q")  # by_residual, code_size
            _product_quantizer(cursor)
        _inverted_lists(cursor)
    elif tag == b"IxPT":
        _header(cursor)
        (count,) = cursor.unpack("i")
        for _ in range(count):
            _transform(cursor)
        _float_index(cursor)
    elif tag == b"IxRF":
        _header(cursor)
        _float_index(cursor)
        _float_index(cursor)
        cursor.unpack("f")  # k_factor
    elif tag in (b"IxMp", b"IxM2"):
        _header(cursor)
        _float_index(cursor)
        cursor.vector(8, "the id map")
    else:
        raise _Stop


def _binary_index(cursor: _Cursor) -> None:
    tag = cursor.take(4)
    if tag == b"IBxF":
        cursor.unpack(BINARY_HEADER.format[1:])
        cursor.vector(1, "the codes")
    elif tag == b"IBHf":
        cursor.unpack(BINARY_HEADER.format[1:])
        _hnsw(cursor)
        _binary_index(cursor)
    elif tag == b"IBwF":
        cursor.unpack(BINARY_HEADER.format[1:])
        cursor.unpack("QQ")  # nlist, nprobe
        _binary_index(cursor)
        _direct_map(cursor)
        _inverted_lists(cursor)
    elif tag in (b"IBMp", b"IBM2"):
        cursor.unpack(BINARY_HEADER.format[1:])
        _binary_index(cursor)
        cursor.vector(8, "the id map")
    else:
        raise _Stop


def _scalar_quantizer(cursor: _Cursor) -> None:
    cursor.unpack("iifQQ")  # qtype, rangestat, rangestat_arg, d, code_size
    cursor.vector(4, "the scalar quantizer's trained ranges")


def _product_quantizer(cursor: _Cursor) -> None:
    cursor.unpack("QQQ")  # d, M, nbits
    cursor.vector(4, "the product quantizer's centroids")


def _hnsw(cursor: _Cursor) -> None:
    cursor.vector(8, "the HNSW level probabilities")
    cursor.vector(4, "the HNSW neighbours per level")
    cursor.vector(4, "the HNSW levels")
    cursor.vector(8, "the HNSW offsets")
    cursor.vector(4, "the HNSW neighbours")
    cursor.unpack("iiiii")  # entry_point, max_level, efConstruction, efSearch, a dummy


def _ivf_header(cursor: _Cursor) -> None:
    _header(cursor)
    cursor.unpack("QQ")  # nlist, nprobe
    _float_index(cursor)
    _direct_map(cursor)


def _direct_map(cursor: _Cursor) -> None:
    (kind,) = cursor.unpack("b")
    cursor.vector(8, "the direct map")
    if kind == 2:
        cursor.vector(16, "the direct map's hash table")


def _inverted_lists(cursor: _Cursor) -> None:
    tag = cursor.take(4)
    if tag != b"ilar":  # il00: none; ilod (on disk: index.ivfdata, checked at open), another hook: not known here
        raise _Stop
    nlist, code_size = cursor.unpack("QQ")
    kind = cursor.take(4)
    if kind == b"full":
        (count,) = cursor.unpack("Q")
        if count != nlist:  # FAISS refuses it after reading: the sizes' table is what it allocates by
            raise _Short(f"a table of {count} list sizes for {nlist} lists at byte {cursor.pos - 8}")
        sizes = struct.unpack(f"<{count}Q", cursor.take(8 * count))
        total = sum(sizes)
    elif kind == b"sprs":
        (count,) = cursor.unpack("Q")
        pairs = struct.unpack(f"<{count}Q", cursor.take(8 * count))
        total = sum(pairs[1::2])
    else:
        raise _Stop
    cursor.skip(total * (code_size + 8), f"{total} listed vectors' codes and ids")


def _transform(cursor: _Cursor) -> None:
    tag = cursor.take(4)
    if tag not in TRANSFORMS:
        raise _Stop
    cursor.unpack("?")  # have_bias
    cursor.vector(4, "a linear transform's matrix")
    cursor.vector(4, "a linear transform's bias")
    cursor.unpack("ii?")  # d_in, d_out, is_trained
