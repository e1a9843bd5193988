"""Config drift through the model directory (RELIABILITY.md promises 3 and 6): config.json's keys that shape
vectors are part of the store fingerprint and the index's identity, as the weights are. An edit with the same
weights is refused (78, naming the key) by an update and by ``petal query``; ``--full`` re-embeds; a key petal
does not read (``_name_or_path``, ``transformers_version``) changes nothing. Real runs of the packaged default
model, copied (weights linked) to a temp directory."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir
from petal.pipeline.manifest import MANIFEST_FILE
from tests.forkrun import petal


@pytest.fixture
def model(tmp_path: Path, minilm_dir: Path) -> Path:
    path = tmp_path / "model"
    shutil.copytree(minilm_dir, path, ignore=shutil.ignore_patterns("model.safetensors"))
    os.symlink(minilm_dir / "model.safetensors", path / "model.safetensors")  # the same weights
    return path


def write_data(root: Path, name: str = "a") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [f"{name}{i}" for i in range(6)],
                             "text": [f"document {name} number {i} about glaciers" for i in range(6)]}),
                   root / f"{name}.parquet")
    return root


def edit_config(model: Path, name: str = "config.json", **changes: object) -> None:
    path = model / name
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config, indent=2))


def index(tmp_path: Path, model: Path, *extra: str):
    return petal(["index", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--model", str(model),
                  "--json-report", str(tmp_path / "report.json"), *extra])


def live(tmp_path: Path) -> dict:
    out = OutputDir(tmp_path / "out")
    return json.loads((out.version_dir(out.current_version()) / MANIFEST_FILE).read_text())


@pytest.mark.parametrize(("changes", "named"), [
    ({"hidden_act": "relu"}, "hidden_act"),
    ({"layer_norm_eps": 1e-5}, "norm_eps"),
    ({"num_attention_heads": 6}, "num_heads"),
])
def test_a_config_edit_with_the_same_weights_is_refused_as_drift(tmp_path, model, changes, named):
    write_data(tmp_path / "data")
    first = index(tmp_path, model)
    assert first.rc == 0, first.stderr
    version = live(tmp_path)["version"]
    edit_config(model, **changes)
    write_data(tmp_path / "data", "b")  # an update: the new shard would be embedded under the new config
    again = index(tmp_path, model)
    assert again.rc == 78, again.stderr
    assert f"model_config.{named}" in again.stderr and "--full" in again.stderr, again.stderr
    assert live(tmp_path)["version"] == version  # nothing published

    query = petal(["query", str(tmp_path / "out"), "glaciers", "--model", str(model)])
    assert query.rc == 78 and f"config.{named}" in query.stderr, query.stderr

    full = index(tmp_path, model, "--full")  # the user asks for a rebuild: every shard re-embedded
    assert full.rc == 0, full.stderr
    assert full.report["rows"]["embedded"] == 12, full.report["rows"]
    assert petal(["query", str(tmp_path / "out"), "glaciers", "--model", str(model)]).rc == 0


def test_a_pooling_file_edit_is_refused_as_drift(tmp_path, model):
    write_data(tmp_path / "data")
    assert index(tmp_path, model).rc == 0
    edit_config(model, "1_Pooling/config.json", pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    write_data(tmp_path / "data", "b")
    again = index(tmp_path, model)
    assert again.rc == 78 and "pooling" in again.stderr, again.stderr


def test_keys_petal_does_not_read_change_nothing(tmp_path, model):
    write_data(tmp_path / "data")
    first = index(tmp_path, model)
    assert first.rc == 0, first.stderr
    recorded = live(tmp_path)["embedding"]["model_config"]
    assert recorded["hidden_act"] == "gelu" and recorded["num_heads"] == 12, recorded
    assert recorded["max_position_embeddings"] == 512 and recorded["rope_theta"] == 10000.0, recorded
    edit_config(model, _name_or_path="somewhere/else", transformers_version="9.9.9",
                architectures=["BertModel", "BertForMaskedLM"])
    again = index(tmp_path, model)
    assert again.rc == 0, again.stderr
    assert again.report["rows"]["embedded"] == 0, again.report["rows"]
    assert petal(["query", str(tmp_path / "out"), "glaciers", "--model", str(model)]).rc == 0


def test_an_index_that_did_not_record_the_config_keeps_its_fingerprints(tmp_path, model):
    """An index built before petal recorded the model's config updates as before (nothing re-embedded); --full
    records it."""
    write_data(tmp_path / "data")
    assert index(tmp_path, model).rc == 0
    out = OutputDir(tmp_path / "out")
    path = out.version_dir(out.current_version()) / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    del manifest["embedding"]["model_config"]
    path.write_text(json.dumps(manifest, indent=2))
    # NOTE: this store's entries were made with the config in their fingerprint: re-embedded once, without it
    assert index(tmp_path, model).rc == 0
    assert "model_config" not in live(tmp_path)["embedding"]
    again = index(tmp_path, model)  # what an older index's runs do: no drift, nothing re-embedded
    assert again.rc == 0, again.stderr
    assert again.report["rows"]["embedded"] == 0, again.report["rows"]
    full = index(tmp_path, model, "--full")
    assert full.rc == 0 and "model_config" in live(tmp_path)["embedding"], full.stderr
