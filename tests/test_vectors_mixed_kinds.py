"""Precomputed vectors into an index built from text, or text into an index of precomputed vectors: 78 saying
what the index holds and what the run indexes (before, the one difference was buried in ~25 'model_config.x: A ->
unset' fields), and the way out it gives works. Real Parquet, real FAISS, the packaged MiniLM."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.index.search import IndexReader


def petal(*args) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [*map(str, args), "-q"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""


def test_one_index_holds_one_kind_of_vectors(tmp_path):
    text, vectors = tmp_path / "t.parquet", tmp_path / "v.parquet"
    pq.write_table(pa.table({"id": ["t0", "t1", "t2"], "text": ["glaciers move", "rivers flow", "winds blow"]}), text)
    rows = [list(map(float, v)) for v in np.random.default_rng(0).standard_normal((5, 8))]
    pq.write_table(pa.table({"id": [f"v{i}" for i in range(5)], "emb": pa.array(rows, pa.list_(pa.float32()))}),
                   vectors)
    from_text, from_vectors = tmp_path / "from-text", tmp_path / "from-vectors"
    assert petal("index", text, "--out", from_text)[0] == 0
    assert petal("index", vectors, "--out", from_vectors, "--vectors-column", "emb")[0] == 0

    rc, said = petal("index", vectors, "--out", from_text, "--vectors-column", "emb")
    assert rc == 78 and "holds a model's vectors (bert, 384 dimensions) of text column 'text'" in said \
        and "this run indexes the precomputed vectors of column 'emb' (8 dimensions)" in said, said
    assert "model_config" not in said and "--full --sync --max-removed 100%" in said
    rc, said = petal("index", text, "--out", from_vectors)
    assert rc == 78 and "holds the precomputed vectors of column 'emb' (8 dimensions)" in said \
        and "this run indexes a model's vectors (bert, 384 dimensions) of text column 'text'" in said, said

    rc, said = petal("index", vectors, "--out", from_text, "--vectors-column", "emb", "--full", "--sync",
                     "--max-removed", "100%")
    assert rc == 0, said
    assert IndexReader(from_text).ids.column("id").to_pylist() == [f"v{i}" for i in range(5)]
