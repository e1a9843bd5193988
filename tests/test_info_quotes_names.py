"""``petal info`` quotes the user's strings it repeats as it quotes shard paths: a ``--keep-columns`` or
``--vectors-column`` name holding a newline (any Parquet column name may) was printed raw, splitting the
description over lines a reader (or a script reading it) could not tell from petal's own. Real CLI, real Parquet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests import forkrun


def test_odd_column_names_are_quoted_on_one_line(tmp_path: Path) -> None:
    flat = np.random.default_rng(0).standard_normal((30, 8)).astype(np.float32)
    data = tmp_path / "odd.parquet"
    pq.write_table(pa.table({"id": np.arange(30), "la\nng": ["en"] * 30,
                             "e\nmb": pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), 8)}), data)
    out = tmp_path / "out"
    built = forkrun.petal(["index", str(data), "--out", str(out), "-q", "--vectors-column", "e\nmb",
                           "--keep-columns", "la\nng"], timeout=300)
    assert built.rc == 0, built.stderr[-2000:]
    info = forkrun.petal(["info", str(out)])
    assert info.rc == 0, info.stderr
    lines = info.stdout.splitlines()
    assert 'model        none: precomputed vectors ("e\\nmb", dim 8)' in lines, info.stdout
    assert 'stored       "la\\nng" (beside the ids, by FAISS id)' in lines, info.stdout
    assert all(line[:1] == " " or line[:12].rstrip().isalpha() or line.startswith("built on") for line in lines), \
        info.stdout
