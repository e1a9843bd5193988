"""``petal embed --quantize int8 --calibration INDEX`` (``petal.Embedder(quantize="int8", calibration=INDEX)``) takes
an index's int8 ranges only for the model that index was built with, matched as ``petal query`` matches its model
(``model_mismatch``: weights, tokenizer, pooling, ...): another is a usage error (2, as the other ``--calibration``
refusals) naming what differs, before the model loads. Before: only the output settings (quantize, dim, ...) were
compared, so a model of other weights, or the same model under another pooling, took the index's ranges, silently,
exit 0, and every code was off. The packaged model (and a copy of it with other weights), real Parquet, the CLI."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import petal
from petal.cli.main import cli

TEXTS = [f"{w} number {i} about {t}" for i, (w, t) in enumerate(
    (w, t) for w in ("glaciers", "rivers", "dunes", "forests") for t in ("erosion", "climate", "rock", "water",
                                                                          "time", "maps"))]


@pytest.fixture(scope="module")
def indexes(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("calibration")
    shard = root / "docs.parquet"
    pq.write_table(pa.table({"id": list(range(len(TEXTS))), "text": TEXTS}), shard)
    out = {}
    for name, extra in {"mean": [], "cls": ["--pooling", "cls"]}.items():
        result = CliRunner().invoke(cli, ["index", str(shard), "--out", str(root / name), "-q", "--quantize",
                                          "int8", *extra])
        assert result.exit_code == 0, result.output
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def other_weights(tmp_path_factory, minilm_dir):
    """MiniLM with one weight changed: the same architecture, tokenizer, pooling and dim, other vectors."""
    from safetensors.numpy import load_file, save_file

    path = tmp_path_factory.mktemp("minilm-other") / "model"
    shutil.copytree(minilm_dir, path, ignore=shutil.ignore_patterns("model.safetensors", "*.bin", "onnx", "openvino"))
    tensors = load_file(minilm_dir / "model.safetensors")
    name = next(k for k in sorted(tensors) if k.endswith("word_embeddings.weight"))
    tensors[name] = tensors[name] + np.float32(0.05)
    save_file(tensors, path / "model.safetensors")
    return path


def embed(*args: str):
    return CliRunner().invoke(cli, ["embed", "glaciers", "dunes", "--quantize", "int8", *args])


def test_an_index_of_other_weights_is_refused(indexes, other_weights):
    result = embed("--model", str(other_weights), "--calibration", str(indexes["mean"]))
    assert result.exit_code == 2, result.output
    assert "does not match the index (weights_sha256: index" in result.stderr and result.stdout == "", result.output
    with pytest.raises(petal.UsageError, match=r"does not match the index \(weights_sha256"):
        petal.Embedder(other_weights, "cpu", quantize="int8", calibration=indexes["mean"])


def test_an_index_of_another_pooling_is_refused(indexes):
    result = embed("--calibration", str(indexes["cls"]))
    assert result.exit_code == 2, result.output
    assert "does not match the index (pooling: index 'cls', model 'mean')" in result.stderr, result.output
    assert result.stdout == ""
    result = embed("--pooling", "cls", "--calibration", str(indexes["mean"]))
    assert result.exit_code == 2 and "pooling: index 'mean', model 'cls'" in result.stderr, result.output
    with pytest.raises(petal.UsageError, match=r"pooling: index 'cls', model 'mean'"):
        petal.Embedder(device="cpu", quantize="int8", calibration=indexes["cls"])


@pytest.mark.parametrize(("name", "extra"), [("mean", []), ("cls", ["--pooling", "cls"])])
def test_the_index_of_the_same_model_and_pooling_still_gives_its_ranges(indexes, name, extra):
    result = embed(*extra, "--calibration", str(indexes[name]))
    assert result.exit_code == 0, result.output
    codes = [json.loads(line)["embedding"] for line in result.stdout.splitlines()]
    assert len(codes) == 2 and all(len(row) == 384 and all(-128 <= v <= 127 for v in row) for row in codes)
    with petal.Embedder(device="cpu", quantize="int8", calibration=indexes[name], pooling=extra[1] if extra else None) \
            as embedder:
        np.testing.assert_array_equal(embedder.encode(["glaciers", "dunes"]), np.array(codes))
