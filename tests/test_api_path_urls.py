"""Every path argument of the Python API is converted as the CLI's: a ``file://`` URL is the local path it names,
another URL (``s3://``, ``gs://``, ``https://``) a ``UsageError`` (2) naming the argument, before anything is written.
``model`` (API) and ``--model`` (CLI) the same, a Hugging Face id still read from the local cache.

Before: only the CLI converted them (``PathParam``). ``petal.index(SRC, "s3://bucket/idx")`` succeeded and wrote the
index to ``./s3:/bucket/idx``, ``petal.index(SRC, "file:///x")`` to ``./file:/x``; ``open_index("file:///idx")`` was 78
'/cwd/file:/idx is not a petal index'; ``--model file:///m`` and ``model="file:///m"`` were 78 'looked at
/cwd/file:/m'. Real files: Parquet, FAISS, and the packaged MiniLM where a model is needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from tests import test_empty_paths
from tests.fake_cli import invoke
from tests.test_model_dir_audit import copy_model

shard = test_empty_paths.shard  # a fixture: a shard of 12 precomputed vectors with text


@pytest.fixture
def cwd(tmp_path, monkeypatch) -> Path:
    """An empty working directory: where a URL taken for a relative path would land."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def url(path: Path) -> str:
    return path.as_uri()  # file:///..., a space as %20


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_file_urls_name_the_local_paths_of_every_api_path_argument(shard, tmp_path, cwd):
    out, report_file = tmp_path / "my idx", tmp_path / "my report.json"
    report = petal.index(shard, url(out), vectors_column="emb", json_report=url(report_file), quiet=True)
    assert report.status == "success" and report.out == str(out), report.out
    assert json.loads(report_file.read_text())["status"] == "success"
    pq.write_table(pa.table({"id": ["0", "1"]}), tmp_path / "del ids.parquet")
    report = petal.index(shard, url(out), vectors_column="emb", delete=url(tmp_path / "del ids.parquet"), quiet=True)
    assert report.status == "success", report.message
    with petal.open_index(url(out)) as index:
        assert index.num_vectors == 10 and index.path.parent == out / "versions"
    with petal.Index("file://localhost" + str(out).replace(" ", "%20")) as index:
        assert index.num_vectors == 10
    verified = petal.verify(url(out))
    assert verified.ok and Path(verified.version_dir).parent == out / "versions"
    rebuilt = petal.rebuild(url(out), json_report=url(tmp_path / "rebuilt.json"), index_factory="HNSW8,Flat")
    assert rebuilt.status == "success" and rebuilt.out == str(out)
    assert json.loads((tmp_path / "rebuilt.json").read_text())["version"] == rebuilt.version
    assert petal.versions(url(out))[0].version == rebuilt.version
    rolled = petal.rollback(url(out))
    assert rolled.out == out and rolled.previous == rebuilt.version and rolled.changed
    assert listing(cwd) == []


REFUSED = {
    "index out": ("out", "s3://bkt/idx", lambda o, s: petal.index(s, "s3://bkt/idx", vectors_column="emb")),
    "index json_report": ("json_report", "s3://bkt/r.json",
                          lambda o, s: petal.index(s, o, vectors_column="emb", json_report="s3://bkt/r.json")),
    "index delete": ("delete", "s3://bkt/ids.parquet",
                     lambda o, s: petal.index(s, o, vectors_column="emb", delete="s3://bkt/ids.parquet")),
    "index model": ("model", "s3://bkt/model", lambda o, s: petal.index(s, o, model="s3://bkt/model")),
    "open_index": ("path", "s3://bkt/idx", lambda o, s: petal.open_index("s3://bkt/idx")),
    "Index": ("path", "gs://bkt/idx", lambda o, s: petal.Index("gs://bkt/idx")),
    "open_index model": ("model", "http://host/model", lambda o, s: petal.open_index(o, model="http://host/model")),
    "verify": ("out", "s3://bkt/idx", lambda o, s: petal.verify("s3://bkt/idx")),
    "rebuild": ("out", "s3://bkt/idx", lambda o, s: petal.rebuild("s3://bkt/idx")),
    "versions": ("out", "s3://bkt/idx", lambda o, s: petal.versions("s3://bkt/idx")),
    "rollback": ("out", "gs://bkt/idx", lambda o, s: petal.rollback("gs://bkt/idx")),
    "rebuild json_report": ("json_report", "s3://bkt/r.json",
                            lambda o, s: petal.rebuild(o, json_report="s3://bkt/r.json")),
    "Embedder calibration": ("calibration", "s3://bkt/idx",
                             lambda o, s: petal.Embedder(calibration="s3://bkt/idx", quantize="int8")),
    "Embedder model": ("model", "https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2",
                       lambda o, s: petal.Embedder("https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2")),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_another_url_on_an_api_path_argument_is_a_usage_error_naming_it(case, shard, tmp_path, cwd):
    name, given, call = REFUSED[case]
    out = tmp_path / "idx"
    petal.index(shard, out, vectors_column="emb", quiet=True)
    before = listing(out)
    with pytest.raises(petal.UsageError) as refused:
        call(out, shard)
    message = str(refused.value)
    assert refused.value.exit_code == 2
    assert f"{name}: {given} is a URL; this takes a local" in message, message
    report = getattr(refused.value, "report", None)
    assert report is None or report.exit_code == 2
    assert listing(cwd) == [] and listing(out) == before


def test_a_report_of_a_refused_run_goes_to_the_local_path_its_file_url_names(shard, tmp_path, cwd):
    """The report of a run refused for another argument is written where ``json_report`` points (it was written to
    ``./file:/...``), and not at all when ``json_report`` itself is another URL (it was ``./s3:/...``)."""
    report_file = tmp_path / "report.json"
    with pytest.raises(petal.UsageError, match=r"delete: s3://bkt/ids\.parquet is a URL"):
        petal.index(shard, tmp_path / "o", vectors_column="emb", json_report=url(report_file),
                    delete="s3://bkt/ids.parquet")
    assert json.loads(report_file.read_text())["exit_code"] == 2
    with pytest.raises(petal.UsageError, match=r"(out|json_report): s3://bkt/\S+ is a URL"):
        petal.index(shard, "s3://bkt/idx", vectors_column="emb", json_report="s3://bkt/r.json")
    with pytest.raises(petal.UsageError, match="out: s3://bkt/idx is a URL"):
        petal.rebuild("s3://bkt/idx", json_report=url(tmp_path / "rebuild.json"))
    assert json.loads((tmp_path / "rebuild.json").read_text())["exit_code"] == 2
    assert listing(cwd) == [] and not (tmp_path / "o").exists()


def test_a_file_url_model_and_calibration_name_the_local_directories(minilm_dir, tmp_path, cwd):
    """``model="file:///..."`` is the model directory it names (``index``, ``open_index``, ``Embedder``), and
    ``calibration="file:///..."`` the index whose int8 ranges to take."""
    src = tmp_path / "s.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["glaciers flow", "bread rises", "cats purr"]}), src)
    out = tmp_path / "int8 idx"
    report = petal.index(src, out, model=url(minilm_dir), quantize="int8", device="cpu", quiet=True)
    assert report.status == "success"
    with petal.Embedder(url(minilm_dir), "cpu", quantize="int8", calibration=url(out)) as embedder, \
            petal.Embedder(str(minilm_dir), "cpu", quantize="int8", calibration=out) as plain:
        assert embedder.spec.path == minilm_dir.resolve()
        np.testing.assert_array_equal(embedder.encode(["glaciers"]), plain.encode(["glaciers"]))
    with petal.open_index(url(out), model=url(minilm_dir), device="cpu") as index:
        assert index.search(["glaciers flow"], k=1)[0][0].id == "a"
    assert listing(cwd) == []


def test_model_flag_takes_a_file_url_refuses_other_urls_and_keeps_hugging_face_ids(minilm_dir, tmp_path, cwd,
                                                                                    monkeypatch):
    """``--model file:///m`` is the directory ``/m`` (it was 78 'looked at /cwd/file:/m'); ``--model s3://...`` or
    ``https://...`` is 2 naming it (was 78, not found); ``--model acme/mini`` (a Hugging Face id, no ``scheme://``)
    still loads the snapshot of the local cache."""
    hub = tmp_path / "hub"
    copy_model(minilm_dir, hub / "models--acme--mini" / "snapshots" / "0123abcd")
    (hub / "models--acme--mini" / "refs").mkdir()
    (hub / "models--acme--mini" / "refs" / "main").write_text("0123abcd\n")
    for name in ("HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    vectors = {}
    for label, model in (("url", url(minilm_dir)), ("id", "acme/mini"), ("dir", str(minilm_dir))):
        result = invoke(["embed", "glaciers flow", "--model", model, "--device", "cpu",
                         "--output", str(tmp_path / f"{label}.npy")])
        assert result.exit_code == 0, (model, result.output)
        vectors[label] = np.load(tmp_path / f"{label}.npy")
    np.testing.assert_array_equal(vectors["url"], vectors["dir"])
    np.testing.assert_array_equal(vectors["id"], vectors["dir"])
    for model in ("s3://bkt/model", "https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2"):
        result = invoke(["embed", "glaciers flow", "--model", model, "--output", str(tmp_path / "x.npy")])
        assert result.exit_code == 2, result.output
        assert "--model" in result.output and f"{model} is a URL; this takes a local model directory" in \
            result.output, result.output
    result = invoke(["embed", "x", "--model", "file://elsewhere/model"])
    assert result.exit_code == 2 and "another host" in result.output, result.output
    result = invoke(["embed", "x", "--model", "acme/no-such-model"])
    assert result.exit_code == 78 and "not found" in result.output, result.output  # an id: looked for, not refused
    assert listing(cwd) == [] and not (tmp_path / "x.npy").exists()
