"""Non-finite vectors are never written or returned silently.

- A checkpoint holding NaN or infinity (or a value the load dtype cannot hold) is refused when it loads: exit 78
  naming the file and the checkpoint tensor, for ``petal embed``, ``petal index`` and ``petal query`` and the
  Python API. Before: NaN vectors (or, through the small-batch kernels, finite but wrong ones) and exit 0.
- A model with finite weights can still turn a text into NaN (an overflow inside it): ``petal embed`` skips that
  text in its place (``non_finite_embedding``, as ``petal index`` does), ``petal query`` refuses such a query (65,
  nothing written) or, in a ``--stdin`` stream, skips the line and says so.

Real tiny BERT checkpoints saved by transformers (tests/tiny_models.py), edited with safetensors, real processes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file, save_file

import petal
from tests import forkrun
from tests.conftest import REPO
from tests.test_open_audit_tamper import refused
from tests.tiny_models import make_model, vocab

NAN_TENSOR = "encoder.layer.1.attention.self.key.weight"  # loaded into the fused qkv parameter
DOCS = ["how do glaciers move", "bread dough rises because yeast ferments", "vector search finds neighbours"]


def petal_cli(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """``petal ARGV`` in its own process: forked from the preloaded forkserver (stdin /dev/null), or a fresh
    interpreter where the run reads ``stdin`` (forkrun has none)."""
    if stdin is not None:
        return subprocess.run([sys.executable, "-m", "petal.cli.main", *argv], capture_output=True, text=True,
                              cwd=REPO, timeout=300, input=stdin)
    run = forkrun.petal(list(argv), timeout=300)
    return subprocess.CompletedProcess(["petal", *argv], run.rc, run.stdout, run.stderr)


def edited(src: Path, dst: Path, change) -> Path:
    """A copy of model ``src`` whose model.safetensors went through ``change(tensors)``."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    change(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nonfinite")
    clean = root / "clean"
    make_model("bert", clean)

    def nan(tensors):
        tensors[NAN_TENSOR][3, 5] = float("nan")

    def poison(tensors):  # finite, but its LayerNorm overflows: every text holding "bread" embeds to NaN
        tensors["embeddings.word_embeddings.weight"][vocab()["bread"]] = 3e38

    def beyond_float16(tensors):
        tensors["encoder.layer.0.output.dense.weight"][1, 2] = 1e5

    return {"clean": clean, "nan": edited(clean, root / "nan", nan), "poison": edited(clean, root / "poison", poison),
            "big": edited(clean, root / "big", beyond_float16), "root": root}


@pytest.fixture(scope="module")
def shard(models) -> Path:
    path = models["root"] / "docs.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "text": DOCS}), path)
    return path


def said_nan(line: str, model: Path) -> None:
    assert str(model / "model.safetensors") in line and repr(NAN_TENSOR) in line and "NaN or infinite" in line, line


# --- weights that are not finite: 78 naming the file and the tensor -------------------------------------------------

def test_petal_embed_refuses_nan_weights(models, tmp_path):
    for extra in ([], ["--output", str(tmp_path / "e.npy")]):
        proc = petal_cli("embed", "--model", str(models["nan"]), "glaciers move", "bread", *extra)
        said_nan(refused(proc, 78), models["nan"])
        assert proc.stdout == ""
    assert not (tmp_path / "e.npy").exists()


def test_petal_index_refuses_nan_weights(models, shard, tmp_path):
    proc = petal_cli("index", str(shard), "--out", str(tmp_path / "out"), "--model", str(models["nan"]), "-q")
    said_nan(refused(proc, 78), models["nan"])
    assert not (tmp_path / "out" / "CURRENT").exists()


def test_petal_query_refuses_nan_weights(models, shard, tmp_path):
    """An index whose recorded model holds NaN (built by a petal that did not check: here its vectors come from the
    clean copy of the same model): the query loads the model and is refused, nothing on stdout."""
    from petal.engine.engine import Engine
    from petal.engine.loader import inspect_model, load_model

    clean = load_model(inspect_model(models["clean"]), torch.device("cpu"), torch.float32)
    petal.index(shard, tmp_path / "out", model=str(models["nan"]), quiet=True, device="cpu",
                engine_factory=lambda spec, config: Engine(spec, config, model=clean))
    for extra in ([], ["--json"], ["--stdin"]):
        proc = petal_cli("query", str(tmp_path / "out"), *(["glaciers"] if "--stdin" not in extra else []), *extra,
                         stdin="glaciers\n" if "--stdin" in extra else None)
        said_nan(refused(proc, 78), models["nan"])
        assert proc.stdout == ""
    with petal.open_index(tmp_path / "out", device="cpu") as index, pytest.raises(petal.ConfigError) as info:
        index.search("glaciers", k=1)
    said_nan(str(info.value), models["nan"])


def test_the_embedder_refuses_nan_weights(models):
    with pytest.raises(petal.ConfigError) as info:
        petal.Embedder(str(models["nan"]), "cpu")
    said_nan(str(info.value), models["nan"])
    assert "encoder.layer.1.attention.self.qkv.weight" in str(info.value)  # the parameter it fills, too


def test_the_shard_holding_the_tensor_is_named(models, tmp_path):
    """A sharded checkpoint (model.safetensors.index.json): the file named is the shard that holds the tensor."""
    model = tmp_path / "sharded"
    shutil.copytree(models["nan"], model)
    tensors = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    names = sorted(tensors)
    first = [n for n in names if n != NAN_TENSOR][: len(names) // 2]
    parts = {"model-00001-of-00002.safetensors": first,
             "model-00002-of-00002.safetensors": [n for n in names if n not in first]}
    for file, keys in parts.items():
        save_file({k: tensors[k] for k in keys}, model / file, metadata={"format": "pt"})
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: file for file, keys in parts.items() for k in keys}}))
    with pytest.raises(petal.ConfigError) as info:
        petal.Embedder(str(model), "cpu")
    assert f"{model / 'model-00002-of-00002.safetensors'}: tensor {NAN_TENSOR!r}" in str(info.value)


def test_pickle_weights_are_checked_too(models, tmp_path):
    model = tmp_path / "pickled"
    shutil.copytree(models["nan"], model)
    torch.save(load_file(model / "model.safetensors"), model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    with pytest.raises(petal.ConfigError) as info:
        petal.Embedder(str(model), "cpu", allow_pickle_weights=True)
    assert "pytorch_model.bin" in str(info.value) and repr(NAN_TENSOR) in str(info.value), info.value


def test_a_value_beyond_the_load_dtype_is_named(models):
    """1e5 is finite in the float32 checkpoint and infinity in float16: the cast is named, with the way out."""
    from petal.engine.errors import ModelError
    from petal.engine.loader import inspect_model, load_model

    spec = inspect_model(models["big"])
    with pytest.raises(ModelError) as info:
        load_model(spec, torch.device("cpu"), torch.float16)
    message = str(info.value)
    assert "'encoder.layer.0.output.dense.weight' holds 1 value beyond float16's range, which loads as infinity" \
        in message, message
    assert "--dtype bfloat16 or float32" in message
    load_model(spec, torch.device("cpu"), torch.float32)  # finite in float32: it loads


# --- finite weights, a text that embeds to NaN ---------------------------------------------------------------------

TEXTS = ["glaciers move", "bread dough rises", "vector search"]


def test_petal_embed_skips_a_text_that_embeds_to_nan(models, tmp_path):
    proc = petal_cli("embed", "--model", str(models["poison"]), *TEXTS)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines[1] == {"index": 1, "embedding": None, "skipped": "non_finite_embedding"}
    assert all(np.isfinite(lines[i]["embedding"]).all() for i in (0, 2))
    assert "1 skipped (non_finite_embedding 1; at input 1)" in proc.stderr.splitlines()[-1]
    # int8 codes learned from the texts: the NaN row neither becomes codes nor moves the ranges of the others
    with_it, without = tmp_path / "with.npy", tmp_path / "without.npy"
    for out, texts in ((with_it, TEXTS), (without, [TEXTS[0], TEXTS[2]])):
        proc = petal_cli("embed", "--model", str(models["poison"]), "--quantize", "int8", "--output", str(out), *texts)
        assert proc.returncode == 0, proc.stderr
    codes = np.load(with_it)
    assert (codes[1] == 0).all()
    np.testing.assert_array_equal(codes[[0, 2]], np.load(without))


def test_the_embedder_says_which_text_it_skipped(models):
    embedded = petal.Embedder(str(models["poison"]), "cpu").embed(["bread", *TEXTS, None])
    assert embedded.skipped == {0: "non_finite_embedding", 2: "non_finite_embedding", 4: "null_text"}
    assert np.isfinite(embedded.rows[[1, 3]]).all()
    with pytest.raises(petal.NoInputError, match="non_finite_embedding 2"):
        petal.Embedder(str(models["poison"]), "cpu").embed(["bread", "bread rises"])


@pytest.fixture(scope="module")
def poison_index(models, shard) -> Path:
    out = models["root"] / "poison-out"
    proc = petal_cli("index", str(shard), "--out", str(out), "--model", str(models["poison"]), "--json-report",
                     str(models["root"] / "report.json"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((models["root"] / "report.json").read_text())
    assert report["rows"]["skipped"] == {"non_finite_embedding": 1}  # petal index's rule: the bread row
    return out


def test_petal_query_refuses_a_query_that_embeds_to_nan(poison_index):
    for extra in ([], ["--json"], ["--show-text"]):
        proc = petal_cli("query", str(poison_index), "glaciers", "  ", "bread rises", "-k", "1", *extra)
        refused(proc, 65, 'query 2 ("bread rises")', "NaN or infinite")
        assert proc.stdout == "", proc.stdout  # the answer of "glaciers" is not written either


def test_a_stdin_stream_skips_such_a_line_and_goes_on(poison_index):
    proc = petal_cli("query", str(poison_index), "--stdin", "--json", "-k", "1",
                     stdin="glaciers\nbread rises\nvector search\n")
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]  # each line answered in its place
    assert [a["query"] for a in answers] == ["glaciers", "bread rises", "vector search"]
    assert answers[1] == {"query": "bread rises", "hits": [], "skipped": "non_finite_embedding"}
    assert 'skipped --stdin line "bread rises"' in proc.stderr and "1 stdin line skipped (non_finite_embedding)" \
        in proc.stderr
    only = petal_cli("query", str(poison_index), "--stdin", stdin="bread\n")
    refused(only, 66, "nothing to query", "non_finite_embedding 1")


def test_index_search_names_the_query(poison_index):
    with petal.open_index(poison_index, device="cpu") as index:
        with pytest.raises(petal.BadInputError, match=r'query 2 \("bread"\) embeds to NaN'):
            index.search(["glaciers", "", "bread"], k=1)
        assert [h.id for h in index.search(["glaciers"], k=1)[0]] == [1]
