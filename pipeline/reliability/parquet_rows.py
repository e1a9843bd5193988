"""Parquet reads that hold every row the footer counts, or fail as damage.

NOTE: pyarrow skips a data page whose header names a page type it does not know, without an error and before the
page's checksum is looked at: one flipped bit in a page header (its type, or its value count) gives a column
shorter than the footer says. Read alone, such a column shifts every later value onto another row (another
document's text shown for a hit, a ``--where`` mask applied to the wrong vectors, a row numbered wrong in
``petal embed``, an id of a ``--delete`` list lost); read beside another column, pyarrow refuses the unequal
lengths itself. Every read that relies on row positions compares the rows it got with the footer's count.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq


class MissingRows(pa.ArrowInvalid):
    """A read decoded fewer (or more) rows than the Parquet footer counts: the file is damaged. An ``ArrowInvalid``,
    so every reader's handling of a page that fails to decode (65 naming the file) applies to it unchanged."""

    def __init__(self, got: int, expected: int, what: str = "") -> None:
        where = f"{what}: " if what else ""
        super().__init__(f"{where}its pages hold {got:,} rows where the file's footer counts {expected:,} rows (a "
                         "damaged page header or footer)")
        self.got = got
        self.expected = expected


def check_rows(got: int, expected: int, what: str = "") -> None:
    """Raise ``MissingRows`` unless ``got == expected``."""
    if got != expected:
        raise MissingRows(got, expected, what)


def read_whole(pf: pq.ParquetFile, columns: list[str] | None = None) -> pa.Table:
    """Every row group of ``pf`` (``columns``: all when ``None``), every row its footer counts."""
    table = pf.read(columns=columns)
    check_rows(table.num_rows, pf.metadata.num_rows)
    return table


def read_table(path: str | os.PathLike[str], columns: list[str] | None = None, **options: object) -> pa.Table:
    """``pq.read_table(path, columns=...)`` of a single file, every row its footer counts (``options``: what
    ``pq.ParquetFile`` takes, e.g. ``page_checksum_verification``)."""
    with pq.ParquetFile(path, **options) as pf:
        return read_whole(pf, columns)
