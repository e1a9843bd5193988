"""petal index --vectors-column: precomputed embeddings through the store, index, incremental, publish
paths, no model; bad vectors are counted skips; petal query --vector-file and the Python search API."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.index.search import IndexReader

DIM = 16


def vectors(n: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def write(path: Path, prefix: str, vecs: list, fixed: bool = False, **extra) -> None:
    value_type = pa.list_(pa.float32(), DIM) if fixed else pa.list_(pa.float32())
    column = pa.array([None if v is None else list(map(float, v)) for v in vecs], value_type)
    pq.write_table(pa.table({"id": [f"{prefix}-{i}" for i in range(len(vecs))], "emb": column, **extra}), path)


def index(*args) -> tuple[int, str, dict]:
    result = CliRunner().invoke(cli, ["index", *map(str, args), "-q", "--json"])
    assert result.exit_code != 1, result.output
    return result.exit_code, result.stderr, json.loads(result.stdout)


@pytest.mark.parametrize("fixed", [False, True])
def test_precomputed_vectors_are_indexed_without_a_model(tmp_path, fixed):
    a = vectors(100, 1)
    write(tmp_path / "a.parquet", "a", list(a), fixed=fixed, text=[f"doc {i}" for i in range(100)])
    out = tmp_path / "out"
    rc, stderr, report = index(tmp_path / "a.parquet", "--out", out, "--vectors-column", "emb")
    assert rc == 0, stderr
    assert report["index"]["num_vectors"] == 100 and report["model"]["source"] == "precomputed"
    reader = IndexReader(out)
    hits = reader.search(a[:3], 1)  # the Python search path with vectors
    assert [h[0].id for h in hits] == ["a-0", "a-1", "a-2"] and abs(hits[0][0].score - 1.0) < 1e-5

    np.save(tmp_path / "q.npy", a[5])
    result = CliRunner().invoke(cli, ["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "--json",
                                      "--show-text", "-k", "2"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["hits"][0]["id"] == "a-5" and answer["hits"][0]["text"] == "doc 5"
    text_query = CliRunner().invoke(cli, ["query", str(out), "some text"])
    assert text_query.exit_code == 2 and "--vector-file" in text_query.stderr

    # incremental: a second shard is added, the first is reused (additive)
    write(tmp_path / "b.parquet", "b", list(vectors(50, 2)), fixed=fixed)
    rc, stderr, report = index(tmp_path / "b.parquet", "--out", out, "--vectors-column", "emb")
    assert rc == 0 and report["index"]["num_vectors"] == 150 and report["shard_changes"]["kept"]
    rc, stderr, report = index(tmp_path / "a.parquet", tmp_path / "b.parquet", "--out", out, "--vectors-column", "emb")
    assert rc == 0 and report["status"] == "nothing-to-do"


def test_bad_vectors_are_counted_skips_or_65(tmp_path):
    good = vectors(10, 3)
    bad = [*good, None, [1.0, 2.0], [float("nan")] * DIM]
    write(tmp_path / "a.parquet", "a", bad)
    out = tmp_path / "out"
    rc, stderr, report = index(tmp_path / "a.parquet", "--out", out, "--vectors-column", "emb")
    assert rc == 0, stderr
    assert report["rows"]["skipped"] == {"null_vector": 1, "wrong_dim": 1, "non_finite_vector": 1}
    assert report["index"]["num_vectors"] == 10
    rc, stderr, report = index(tmp_path / "a.parquet", "--out", tmp_path / "strict", "--vectors-column", "emb",
                               "--strict")
    assert rc == 65 and "3 bad rows" in stderr


def test_vectors_column_errors(tmp_path):
    write(tmp_path / "a.parquet", "a", list(vectors(5, 4)), text=["x"] * 5)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["index", str(tmp_path / "a.parquet"), "--out", str(out),
                                      "--vectors-column", "text", "-q"])
    assert result.exit_code == 65 and "'text' has type string" in result.stderr
    result = CliRunner().invoke(cli, ["index", str(tmp_path / "a.parquet"), "--out", str(out),
                                      "--vectors-column", "nope", "-q"])
    assert result.exit_code == 65 and "'nope' is missing" in result.stderr
    result = CliRunner().invoke(cli, ["index", str(tmp_path / "a.parquet"), "--out", str(out),
                                      "--vectors-column", "emb", "--dim", "8", "-q"])
    assert result.exit_code == 2 and "--dim" in result.stderr


def test_vector_file_that_cannot_be_taken_as_real_vectors_is_refused_naming_it(tmp_path):
    """A .npz archive (was: a traceback), complex values (was: the imaginary part dropped with a NumPy warning),
    float64 values beyond float32's range (was: refused without naming the file), no rows (was: exit 0, nothing
    said); integers, float16 and float64 are read as float32."""
    a = vectors(20, 5)
    write(tmp_path / "a.parquet", "a", list(a))
    out = tmp_path / "out"
    assert index(tmp_path / "a.parquet", "--out", out, "--vectors-column", "emb")[0] == 0

    def ask(name: str, value: object, save=np.save) -> tuple[int, str]:
        save(tmp_path / name, value)
        result = CliRunner().invoke(cli, ["query", str(out), "--vector-file", str(tmp_path / name), "-k", "1",
                                          "--json"])
        assert result.exception is None or isinstance(result.exception, SystemExit), result.output
        return result.exit_code, result.stderr

    for name, value, code, said in [  # bad input data (65), not a usage error: the flag's value, a path, is fine
        ("q.npz", {"q": a[:1]}, 65, "a .npz archive"),
        ("complex.npy", a[:1].astype(np.complex64), 65, "complex64"),
        ("big.npy", np.full((2, DIM), 1e39), 65, "row 0 holds NaN, infinite values or values beyond float32"),
        ("nan.npy", np.vstack([a[:1], np.full((1, DIM), np.nan)]), 65, "row 1 holds NaN"),
        ("empty.npy", np.zeros((0, DIM), dtype=np.float32), 66, "holds no vectors"),
    ]:
        rc, stderr = ask(name, value, (lambda p, v: np.savez(p, **v)) if name.endswith(".npz") else np.save)
        assert rc == code and f"--vector-file {tmp_path / name}" in stderr and said in stderr, (name, stderr)
    for name, value in [("int.npy", np.round(a[3:4] * 10).astype(np.int64)), ("half.npy", a[3].astype(np.float16)),
                        ("double.npy", a[3:4].astype(np.float64))]:
        assert ask(name, value)[0] == 0, name


@pytest.mark.parametrize("flags, named", [
    (["--device", "cuda"], "--device"), (["--dtype", "float16"], "--dtype"), (["--attention", "torch"], "--attention"),
    (["--max-length", "64"], "--max-length"), (["--token-budget", "1024"], "--token-budget"),
    (["--max-seqs", "8"], "--max-seqs"), (["--no-cuda-graphs"], "--no-cuda-graphs"),
    (["--pooling", "cls"], "--pooling"),
    (["--attention-mask", "causal"], "--attention-mask"), (["--query-prompt", "q: "], "--query-prompt"),
    (["--allow-pickle-weights"], "--allow-pickle-weights"), (["--workers", "2"], "--workers"),
    (["--devices", "1"], "--devices"), (["--ray"], "--ray"), (["--workers", "2", "--range-rows", "10"], "--range-rows"),
])
def test_flags_a_vectors_run_has_no_use_for_are_refused_naming_them(tmp_path, flags, named):
    """A --vectors-column run has no model and runs in one process: the model's, the engine's and the scale-out's
    flags would set nothing (they were silently ignored); exit 2 naming them, before any shard is read."""
    write(tmp_path / "a.parquet", "a", list(vectors(5, 4)))
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["index", str(tmp_path / "a.parquet"), "--out", str(out),
                                      "--vectors-column", "emb", "-q", *flags])
    assert result.exit_code == 2, result.output
    # one flag: "--dim does not apply: leave it out"; several: "--workers, --range-rows do not apply: leave them out"
    assert named in result.stderr, result.stderr
    assert ("do not apply: leave them out" if len([f for f in flags if f.startswith("--")]) > 1
            else "does not apply: leave it out") in result.stderr, result.stderr
    assert not out.exists()
    defaults = CliRunner().invoke(cli, ["index", str(tmp_path / "a.parquet"), "--out", str(out), "--vectors-column",
                                        "emb", "-q", "--device", "auto", "--dtype", "auto", "--max-seqs", "256"])
    assert defaults.exit_code == 0, defaults.output  # a flag given its default value sets nothing new: accepted
