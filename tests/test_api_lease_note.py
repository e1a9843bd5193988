"""A version an open ``petal.Index`` leases is kept by a run's pruning, said on stderr; the note guessed only 'a petal
serve that serves it, having refused the live version?', which sent an operator after a server that did not exist
when a Python program held the version. It now names every kind of reader, the open ``petal.Index`` first. Real
Parquet and FAISS (a ``vectors_column`` index)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import petal


def test_the_note_names_an_open_index_as_a_reader(tmp_path, capfd):
    vectors = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    for seed in (0, 1):
        pq.write_table(pa.table({"id": [f"d{i}" for i in range(20)], "vec": list(vectors + seed)}),
                       tmp_path / "s.parquet")
        if seed == 0:
            first = petal.index(tmp_path / "s.parquet", tmp_path / "out", vectors_column="vec", quiet=True).version
            held = petal.open_index(tmp_path / "out")
            capfd.readouterr()
        else:
            with held:
                report = petal.index(tmp_path / "s.parquet", tmp_path / "out", vectors_column="vec",
                                     keep_versions=1)  # NOTE: not quiet=True, whose notes go to the petal logger
    assert report.pruned["in_use"] == [first]
    said = capfd.readouterr().err
    assert f"kept {first}" in said and "in use by a reader (a petal.Index still open on it" in said, said
    # NOTE: the note said any petal serve 'refused the live version', though a server that has not swapped yet
    # refused nothing: it is on the earlier version until it follows the new one
    assert "refused" not in said and "or a petal serve that is still on it (it leaves it once it follows the new " \
        "version)" in said, said
