"""``petal rebuild OUT`` keeps the index settings the user chose for the live version (its manifest's) where no flag
asks for another: the factory asked for, the metric, the memory budget, the target recall.

Before, every flag not given took ``petal index``'s default: a rebuild of an IVF or HNSW index left with no vectors
(every document deleted; ``petal index`` publishes those as the kind asked for, tests/test_empty_index_kinds.py)
published a Flat one, since ``auto`` chooses by size; an explicit ``IVF2,Flat`` of 40 vectors became Flat too, and an
l2 index became an ip one (its scores changed meaning under its readers). ``--index-factory auto`` still chooses by
size. Real ``petal`` processes, real Parquet and FAISS; the Python API alike.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from tests import forkrun

DIM = 8


def petal_run(*argv: object) -> forkrun.Result:
    """``petal ARGV`` in its own process (forked from the preloaded forkserver; stdin is /dev/null there)."""
    proc = forkrun.petal(list(map(str, argv)), timeout=300)
    assert proc.rc == 0 and "Traceback" not in proc.stderr, (argv, proc.rc, proc.stderr[-3000:])
    return proc


def info(out: Path) -> dict:
    return json.loads(petal_run("info", out, "--json").stdout)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("keep")
    flat = np.random.default_rng(5).standard_normal((40, DIM)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": np.arange(40), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                   root / "a.parquet")
    pq.write_table(pa.table({"id": np.arange(40)}), root / "all.parquet")
    return root


@pytest.fixture(scope="module")
def built(data) -> dict[str, Path]:
    """An index of each kind the user chose explicitly, and one of every document deleted."""
    flags = {"ivf": ["--index-factory", "IVF2,Flat"], "hnsw": ["--index-factory", "HNSW8"],
             "l2": ["--metric", "l2", "--index-memory", "100M", "--target-recall", "0.9"]}
    outs = {}
    for name, extra in flags.items():
        outs[name] = data / name
        petal_run("index", data / "a.parquet", "--out", outs[name], "-q", "--vectors-column", "emb", *extra)
    for name in ("ivf", "hnsw"):
        outs[f"empty-{name}"] = data / f"empty-{name}"
        shutil.copytree(outs[name], outs[f"empty-{name}"])
        petal_run("index", data / "a.parquet", "--out", outs[f"empty-{name}"], "-q", "--vectors-column", "emb",
                  *flags[name], "--delete", data / "all.parquet")
    return outs


@pytest.mark.parametrize(("name", "factory"), [("ivf", "IVF2,Flat"), ("hnsw", "HNSW8"), ("empty-ivf", "IVF2,Flat"),
                                               ("empty-hnsw", "HNSW8")])
def test_a_rebuild_without_flags_keeps_the_factory_asked_for(built, tmp_path, name, factory):
    out = tmp_path / "out"
    shutil.copytree(built[name], out)
    before = info(out)
    assert before["index"]["factory"] == factory
    petal_run("rebuild", out)
    after = info(out)
    assert after["version"] != before["version"] and after["rebuilt_from"] == before["version"]
    assert (after["index"]["factory"], after["index"]["requested_factory"]) == (factory, factory)
    assert after["index"]["num_vectors"] == before["index"]["num_vectors"]
    petal_run("verify", out)
    petal_run("rebuild", out, "--index-factory", "auto")  # asked for: by size again
    assert info(out)["index"]["factory"] == "Flat"


def test_a_rebuild_keeps_the_metric_budget_and_recall_target_unless_asked(built, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(built["l2"], out)
    petal_run("rebuild", out)
    index = info(out)["index"]
    assert (info(out)["metric"], index["metric"]) == ("l2", "l2")
    assert index["settings"]["memory_bytes"] == 100 << 20 and index["settings"]["target_recall"] == 0.9
    petal_run("rebuild", out, "--target-recall", "0.8")  # one flag: that setting alone changes
    index = info(out)["index"]
    assert (index["metric"], index["settings"]["memory_bytes"], index["settings"]["target_recall"]) == \
        ("l2", 100 << 20, 0.8)
    petal_run("rebuild", out, "--metric", "ip")
    assert info(out)["index"]["metric"] == "ip"


def test_the_api_keeps_what_is_not_given(built, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(built["empty-ivf"], out)
    report = petal.rebuild(out)
    assert report.index["factory"] == "IVF2,Flat"
    assert petal.rebuild(out, index_factory="HNSW8").index["factory"] == "HNSW8"
    assert petal.rebuild(out).index["factory"] == "HNSW8"  # the live version's now


def test_an_index_setting_given_as_none_is_left_out(built, data, tmp_path):
    """``metric=None`` (a caller forwarding its own optional argument) keeps the live version's setting, as a flag not
    given does: it was an ``ArgumentTypeError`` ("NoneType, not str"), in ``rebuild`` and ``index`` alike."""
    out = tmp_path / "out"
    shutil.copytree(built["l2"], out)
    unset = {"index_factory": None, "metric": None, "index_memory": None, "target_recall": None}
    index = petal.rebuild(out, quiet=True, **unset).index
    assert (index["metric"], index["settings"]["memory_bytes"], index["settings"]["target_recall"]) == \
        ("l2", 100 << 20, 0.9)
    index = petal.index([data / "a.parquet"], out, vectors_column="emb", quiet=True, full=True, **unset).index
    assert (index["metric"], index["settings"]["memory_bytes"], index["settings"]["target_recall"]) == \
        ("l2", 100 << 20, 0.9)
    first = petal.index([data / "a.parquet"], tmp_path / "first", vectors_column="emb", quiet=True, **unset).index
    assert (first["metric"], first["factory"]) == ("ip", "Flat")  # a first run: the defaults
    with pytest.raises(petal.UsageError, match="metric"):
        petal.rebuild(out, metric=None, quiet=True, metrc=None)  # a misspelled keyword is still named


def test_a_kept_factory_that_cannot_be_built_again_is_78_naming_the_manifest(built, tmp_path):
    """The live version's factory comes from its manifest, not from a flag: one that the stored vectors cannot train
    (a manifest edited and signed again) is a configuration error naming the manifest, not a usage error (2)."""
    from petal.pipeline.index.checksums import CHECKSUM_KEY, canonical_sha256
    from petal.pipeline.layout import OutputDir

    out = tmp_path / "out"
    shutil.copytree(built["ivf"], out)
    path = out / "versions" / str(OutputDir(out).current_version()) / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["index"]["settings"]["factory"] = "IVF64,Flat"
    manifest.pop(CHECKSUM_KEY)
    manifest[CHECKSUM_KEY] = canonical_sha256(manifest)
    path.write_text(json.dumps(manifest))
    proc = forkrun.petal(["rebuild", str(out)], timeout=300)
    assert proc.rc == 78, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert str(path) in last and "kept as no --index-factory was given" in last and "IVF64,Flat" in last, last
    proc = forkrun.petal(["rebuild", str(out), "--index-factory", "IVF64,Flat"], timeout=300)
    assert proc.rc == 2, proc.stderr[-2000:]


@pytest.mark.parametrize("command", ["rebuild", "index"])
def test_a_metric_given_that_the_kept_factory_cannot_take_is_a_usage_error_naming_it(data, tmp_path, command):
    """``--metric ip`` given over a live l2-only factory (LSH) kept from its manifest: the flag given is at fault, not
    the live version (it builds again under its own metric), so a usage error (2) naming the flag and the kept factory,
    as a smaller ``--index-memory`` given is. NOTE: was 78 'the live version's index factory "LSH" ... cannot be built
    again', a configuration error blamed on an index that is fine, whose retry advice was only --index-factory."""
    out = tmp_path / "out"
    petal_run("index", data / "a.parquet", "--out", out, "-q", "--vectors-column", "emb", "--metric", "l2",
              "--index-factory", "LSH")
    argv = ["rebuild", out] if command == "rebuild" else ["index", data / "a.parquet", "--out", out, "-q",
                                                          "--vectors-column", "emb"]
    proc = forkrun.petal(list(map(str, [*argv, "--metric", "ip"])), timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.rc == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "--metric ip" in last and "'LSH'" in last and "live version" in last, last
    assert info(out)["index"]["metric"] == "l2"  # nothing published
    with pytest.raises(petal.UsageError, match=r"^metric ip with the live version's index factory 'LSH'"):  # keywords
        petal.rebuild(out, metric="ip", quiet=True)
    petal_run(*argv, "--metric", "l2")  # the live version's metric: builds


def test_the_api_and_the_cli_record_a_whole_number_target_recall_alike(built, tmp_path):
    """``petal.rebuild(out, target_recall=1)`` records what ``petal rebuild OUT --target-recall 1`` records (1.0, a
    float). NOTE: the API kept the int: the manifest, the report and ``petal info --json`` said 1 where the CLI's said
    1.0, and its warnings '--target-recall 1'."""
    cli_out, api_out = tmp_path / "cli", tmp_path / "api"
    shutil.copytree(built["l2"], cli_out)
    shutil.copytree(built["l2"], api_out)
    petal_run("rebuild", cli_out, "--target-recall", "1")
    report = petal.rebuild(api_out, target_recall=1, quiet=True)
    recorded = [info(out)["index"]["settings"]["target_recall"] for out in (cli_out, api_out)]
    recorded.append(report.index["settings"]["target_recall"])
    assert recorded == [1.0] * 3 and all(isinstance(value, float) for value in recorded), recorded
