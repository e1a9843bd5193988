"""Security and query robustness (RELIABILITY.md promises 12-15): offline before any Hugging Face
import, no pickle, paths stay inside their roots, index files checked, queries checked before search."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.index.search import IndexReader
from petal.pipeline.layout import OutputDir
from tests.conftest import REPO
from tests.fake_cli import fake_hooks
from tests.fake_engine import make_fake_model_dir
from tests.invariants import live

HF_MODULES = ("huggingface_hub", "transformers", "tokenizers", "sentence_transformers", "datasets", "safetensors")
OFFLINE_PROBE = """
import importlib.abc, json, os, sys
first_import = {}
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        root = name.split(".")[0]
        if root in HF_MODULES and root not in first_import:
            first_import[root] = os.environ.get("HF_HUB_OFFLINE")
sys.meta_path.insert(0, Watch())
from petal.cli.main import cli
for argv in json.loads(sys.argv[1]):
    try:
        cli.main(argv, standalone_mode=False)
    except SystemExit as exc:
        assert not exc.code, exc.code
print(json.dumps(first_import))
"""


def test_every_command_is_offline_before_any_hugging_face_import(tmp_path):
    """A fresh interpreter without the offline variables, real MiniLM: index, query, embed, info."""
    data = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["glaciers flow downhill", "bread needs yeast",
                                                       "volcanoes erupt lava"]}), data)
    out, report = tmp_path / "out", tmp_path / "report.json"
    commands = [["index", str(data), "--out", str(out), "-q", "--json-report", str(report)],
                ["query", str(out), "ice sheets moving", "-k", "1", "--json"],
                ["embed", "a query"], ["info", str(out)]]
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE") and not k.startswith("PETAL_")}
    probe = subprocess.run([sys.executable, "-c", f"HF_MODULES = {HF_MODULES!r}\n{OFFLINE_PROBE}",
                            json.dumps(commands)], capture_output=True, text=True, cwd=REPO,
                           env={**env, "PYTHONPATH": str(REPO)}, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    lines = probe.stdout.strip().splitlines()
    first_import = json.loads(lines[-1])
    assert "tokenizers" in first_import  # safetensors files are read by petal itself (engine/models/stream.py)
    assert set(first_import.values()) == {"1"}, first_import  # every one imported with HF_HUB_OFFLINE=1
    assert json.loads(lines[0])["hits"][0]["id"] == 1  # a real model found the glacier document
    assert json.loads(report.read_text())["status"] == "success"


def test_offline_even_when_the_environment_says_online(tmp_path):
    """``HF_HUB_OFFLINE=0`` (and the other two) exported for other tools, and an ``HF_ENDPOINT``, do not turn the
    network back on: before, the values the user had were kept (``setdefault``) and every library saw ``0``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PETAL_")}
    env.update(HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="0", HF_DATASETS_OFFLINE="false",
               HF_ENDPOINT="http://127.0.0.1:9", PYTHONPATH=str(REPO))
    probe = subprocess.run([sys.executable, "-c", f"HF_MODULES = {HF_MODULES!r}\n{OFFLINE_PROBE}"
                            "\nprint(json.dumps({k: os.environ[k] for k in ('TRANSFORMERS_OFFLINE', "
                            "'HF_DATASETS_OFFLINE')}))", json.dumps([["embed", "a query"]])],
                           capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    lines = probe.stdout.strip().splitlines()
    assert "tokenizers" in json.loads(lines[-2]) and set(json.loads(lines[-2]).values()) == {"1"}, lines[-2]
    assert json.loads(lines[-1]) == {"TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


SOURCES = sorted(p for d in ("pipeline", "engine", "cli") for p in (REPO / d).rglob("*.py"))


def test_no_pickle_anywhere_in_petal():
    """No pickle module, no pickled numpy arrays, no remote code; ``torch.load`` (pickle weights, only
    behind an explicit opt-in flag) only in its restricted ``weights_only=True`` mode."""
    forbidden = re.compile(r"\bimport pickle\b|\bpickle\.loads?\(|allow_pickle=True|trust_remote_code=True|"
                           r"weights_only=False")
    calls = {re.compile(r"np\.load\(([^)]*)\)"): "allow_pickle=False",
             re.compile(r"torch\.load\(([^)]*)\)"): "weights_only=True"}
    assert SOURCES
    for path in SOURCES:
        text = path.read_text()
        assert not forbidden.search(text), f"{path}: {forbidden.search(text).group(0)}"
        for call, required in calls.items():
            for found in call.finditer(text):
                assert required in found.group(1), f"{path}: {found.group(0)} without {required}"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """An index built with the fake engine under MiniLM's identity (so ``petal query`` can load MiniLM)."""
    from petal.engine.loader import default_model_dir

    root = tmp_path_factory.mktemp("built")
    data = root / "data"
    data.mkdir()
    for s in range(3):
        rows = {"id": [f"{s}-{i}" for i in range(12)], "text": [f"doc {i} of {s}" for i in range(12)]}
        pq.write_table(pa.table(rows), data / f"{s}.parquet")
    out = root / "out"
    result = CliRunner().invoke(cli, ["index", str(data), "--out", str(out), "-q", "--model", str(default_model_dir())],
                                obj=fake_hooks(str(root / "log")))
    assert result.exit_code == 0, result.output
    return root, data, out


def copy_index(built_root: tuple[Path, Path, Path], tmp_path: Path) -> Path:
    import shutil

    target = tmp_path / "out"
    shutil.copytree(built_root[2], target)
    return target


def test_paths_never_leave_the_output_directory(built, tmp_path):
    runner = CliRunner()
    out = copy_index(built, tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "manifest.json").write_text("{}")
    for pointer in ("../../elsewhere", "/etc", "v000001-20260101T000000Z/../../x"):
        (out / "CURRENT").write_text(pointer + "\n")
        for argv in (["info", str(out)], ["query", str(out), "x"], ["index", str(built[1]), "--out", str(out), "-q"]):
            result = runner.invoke(cli, argv)
            assert result.exit_code == 78 and "not a petal version id" in result.stderr, (pointer, argv, result.output)
    version = OutputDir(built[2]).current_version()
    (out / "CURRENT").write_text(version + "\n")
    real = out / "versions" / version
    real.rename(outside / version)
    real.symlink_to(outside / version)  # a version that is a symlink out of versions/
    result = runner.invoke(cli, ["info", str(out)])
    assert result.exit_code == 78 and "leads out of" in result.stderr
    target = tmp_path / "victim.txt"
    target.write_text("keep me")
    lock_out = tmp_path / "lock-out"
    lock_out.mkdir()
    (lock_out / ".lock").symlink_to(target)  # a planted lock symlink is never followed
    result = runner.invoke(cli, ["index", str(built[1]), "--out", str(lock_out), "-q"],
                           obj=fake_hooks(str(tmp_path / "log")))
    assert result.exit_code == 73 and "lock file" in result.stderr and target.read_text() == "keep me"


def test_tampered_index_is_refused_before_loading(built, tmp_path):
    out = copy_index(built, tmp_path)
    ids = out / "versions" / OutputDir(out).current_version() / "ids.parquet"
    pq.write_table(pa.table({"faiss_id": [0], "id": ["../../etc/passwd"], "shard": ["/etc/passwd"], "row": [0]}), ids)
    result = CliRunner().invoke(cli, ["query", str(out), "anything"])
    assert result.exit_code == 65 and "does not match the manifest" in result.stderr


def test_query_refuses_another_model_before_searching(built, tmp_path):
    runner = CliRunner()
    other = make_fake_model_dir(tmp_path / "other", dim=384, max_length=256)
    result = runner.invoke(cli, ["query", str(built[2]), "x", "--model", str(other)])
    assert result.exit_code == 78 and "does not match the index" in result.stderr
    assert "weights_sha256" in result.stderr and "tokenizer_sha256" not in result.stderr
    out = copy_index(built, tmp_path)
    manifest_file = out / "versions" / OutputDir(out).current_version() / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest["model"]["dim"] = 768
    manifest_file.write_text(json.dumps(manifest))
    result = runner.invoke(cli, ["query", str(out), "x"])
    assert result.exit_code == 78 and "dim: index 768, model 384" in result.stderr


def test_k_beyond_the_index_and_faiss_minus_one_ids(built, tmp_path, fake_model_for_ivf):
    ids, vectors = live(built[2])
    reader = IndexReader(built[2])
    hits = reader.search(vectors[:2], k=1000)
    assert [len(h) for h in hits] == [len(ids), len(ids)] and {h.id for h in hits[0]} == set(ids)
    out = tmp_path / "ivf"
    result = CliRunner().invoke(cli, ["index", str(built[1]), "--out", str(out), "-q", "--index-factory", "IVF8,Flat",
                                      "--model", str(fake_model_for_ivf)],
                                obj=fake_hooks(str(tmp_path / "l")))
    assert result.exit_code == 0, result.output
    ivf = IndexReader(out, nprobe=1)
    ivf_ids = ivf.ids.column("id").to_pylist()
    _, raw = ivf.index.search(ivf.index.reconstruct_n(0, 4), 36)
    assert (raw == -1).any()  # FAISS pads with -1: one list probed holds fewer than k vectors
    for hits, row in zip(ivf.search(ivf.index.reconstruct_n(0, 4), k=36), raw):
        # the -1 padding never maps to a document; the query left short is searched again with more lists (ab51192)
        assert len(hits) == min(36, len(ivf_ids)) > int((row >= 0).sum())
        assert len({h.faiss_id for h in hits}) == len(hits)
        assert all(h.faiss_id >= 0 and h.id == ivf_ids[h.faiss_id] for h in hits)
    assert np.isfinite([h.score for hits in ivf.search(ivf.index.reconstruct_n(0, 1), k=36) for h in hits]).all()


@pytest.fixture(scope="module")
def fake_model_for_ivf(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("ivf-model"))
