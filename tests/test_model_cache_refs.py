"""A model id resolves to the snapshot its cache's ``refs/main`` names: one directory name of ``snapshots/``, read
without taking more than a ref can hold. A ref that leaves the cache (``../..``, an absolute path) or is no ref (1
GB, not text) is refused naming the file (ModelError: 78). Before: the directory such a ref led to was loaded as
the model (a model outside the cache, exit 0), and a 1 GB ``refs/main`` was read whole (3 GB of memory, 12 s).

Real files: the packaged MiniLM (weights linked) as the snapshot and as the directory a ref leads to, ``inspect_model``
and a real ``petal embed`` process.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from petal.engine.errors import ModelError
from petal.engine.loader import inspect_model
from tests import forkrun
from tests.test_model_dir_audit import copy_model

MODEL_ID = "acme/mini"


@pytest.fixture
def cache(minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A hub cache holding ``MODEL_ID``'s snapshot ``0123abcd`` and, beside the cache, another model directory."""
    hub = tmp_path / "hub"
    repo = hub / "models--acme--mini"
    copy_model(minilm_dir, repo / "snapshots" / "0123abcd")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd\n")
    copy_model(minilm_dir, tmp_path / "elsewhere")
    for name in ("HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    return repo / "refs" / "main"


def test_a_ref_naming_a_snapshot_resolves(cache: Path) -> None:
    assert inspect_model(MODEL_ID).path == cache.parent.parent / "snapshots" / "0123abcd"


REFS = {
    "relative escape": lambda ref: ref.write_text("../../../elsewhere"),
    "absolute path": lambda ref: ref.write_text(str(ref.parents[3] / "elsewhere")),
    "parent": lambda ref: ref.write_text(".."),
    "1 GB": lambda ref: os.truncate(ref, 1 << 30),
    "not text": lambda ref: ref.write_bytes(b"\xff\xfe0123"),
}


@pytest.mark.parametrize("case", list(REFS))
def test_a_ref_that_is_no_snapshot_name_is_refused_naming_it(cache: Path, case: str) -> None:
    REFS[case](cache)
    with pytest.raises(ModelError) as info:  # the CLI's and the API's 78 (ConfigError)
        inspect_model(MODEL_ID)
    assert str(cache) in str(info.value) and "commit hash" in str(info.value), str(info.value)


def test_the_cli_exits_78_naming_the_ref(cache: Path) -> None:
    REFS["relative escape"](cache)
    # NOTE: the forked child takes its environment from the forkserver, started by an earlier test: the cache's
    # variables are given, not inherited from this process's monkeypatch (passed alone, failed in the suite)
    env: dict[str, str | None] = {name: None for name in ("HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")}
    env["HF_HUB_CACHE"] = str(cache.parents[2])
    result = forkrun.petal(["embed", "--device", "cpu", "--model", MODEL_ID, "glaciers move"], env=env, timeout=300)
    assert result.rc == 78, result.stderr
    assert f"{cache} holds '../../../elsewhere', which is not the name of a snapshot" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_ref_naming_a_missing_snapshot_is_refused_not_another_loaded(cache: Path) -> None:
    """Before: refs/main naming a snapshot not in the cache fell through to 'the one snapshot present' and loaded
    that other revision (exit 0); huggingface_hub resolves only the snapshot refs/main names."""
    cache.write_text("fedcba98")
    with pytest.raises(ModelError) as info:
        inspect_model(MODEL_ID)
    assert f"{cache} names snapshot 'fedcba98', which is not in" in str(info.value), str(info.value)
    assert "0123abcd" in str(info.value)  # what the cache holds


def test_no_ref_loads_the_one_snapshot_and_refuses_to_pick_among_several(cache: Path) -> None:
    """A revision fetched by its commit hash writes no refs/main: its one snapshot loads; of several none is picked."""
    cache.unlink()
    snapshots = cache.parents[1] / "snapshots"
    assert inspect_model(MODEL_ID) is not None
    shutil.copytree(snapshots / "0123abcd", snapshots / "89abcdef", symlinks=True)
    with pytest.raises(ModelError) as info:
        inspect_model(MODEL_ID)
    assert f"{cache.parents[1]} has no refs/main and several snapshots" in str(info.value), str(info.value)


def test_the_cli_exits_78_naming_the_missing_snapshot(cache: Path) -> None:
    cache.write_text("fedcba98")
    env: dict[str, str | None] = {name: None for name in ("HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")}
    env["HF_HUB_CACHE"] = str(cache.parents[2])
    result = forkrun.petal(["embed", "--device", "cpu", "--model", MODEL_ID, "glaciers move"], env=env, timeout=300)
    assert result.rc == 78, result.stderr
    assert "names snapshot 'fedcba98'" in result.stderr and "Traceback" not in result.stderr
