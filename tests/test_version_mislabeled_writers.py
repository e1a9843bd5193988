"""``petal index`` and ``petal rebuild`` over a version directory whose manifest records another version id
(``pipeline/layout.py``: ``check_version_name``; the readers' side is tests/test_version_mislabeled.py).

Before, a live version copied or renamed by hand (``cp -a versions/V2 versions/V9; echo V9 > CURRENT``) was taken
for the version its manifest records: ``petal index`` built on it and its pruning kept the copy as the only
rollback version while it deleted the real one (V2), ``petal rebuild`` published a version ``rebuilt_from`` V2, and
with the copy named before a real version, the clean-up removed that real, newer version as a leftover. An older
mislabeled directory was counted as a rollback version, so ``--keep-versions`` deleted a real version on its account.
Now a mislabeled live version is refused (65, the manifest, both ids, the way back; nothing deleted) and pruning
leaves a mislabeled directory on disk without counting it, said on stderr.

Real components: ``petal index --vectors-column`` (and once with the packaged model: the session's sample index)
and ``petal rebuild`` through the CLI, Parquet, the store, FAISS.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests._serve_shared import copy_sample_out
from tests.conftest import SAMPLE_DATA


def _shard(data: Path, n: int) -> None:
    data.mkdir(exist_ok=True)
    vectors = np.random.default_rng(n).standard_normal((12, 8)).astype(np.float32)
    pq.write_table(pa.table({"id": pa.array(range(100 * n, 100 * n + 12), pa.int64()),
                             "emb": pa.array([list(map(float, v)) for v in vectors], pa.list_(pa.float32()))}),
                   data / f"s{n}.parquet")


def _run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args])


def _index(tmp_path: Path, *extra: object):
    return _run("index", tmp_path / "data", "--out", tmp_path / "out", "--vectors-column", "emb", "-q", *extra)


def _versions(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "versions").iterdir() if not p.name.startswith("."))


def _live(out: Path) -> str:
    return (out / "CURRENT").read_text().strip()


def _point(out: Path, version: str) -> None:
    tmp = out / ".CURRENT.tmp-test"
    tmp.write_text(version + "\n")
    os.replace(tmp, out / "CURRENT")


def _published(tmp_path: Path, runs: int) -> list[str]:
    """``runs`` index runs, a shard added before each (every version kept): their version ids, oldest first."""
    for n in range(1, runs + 1):
        _shard(tmp_path / "data", n)
        result = _index(tmp_path, "--keep-versions", runs)
        assert result.exit_code == 0, result.output
    versions = _versions(tmp_path / "out")
    assert len(versions) == runs and _live(tmp_path / "out") == versions[-1]
    return versions


@pytest.mark.parametrize("writer", ["index", "rebuild"])
@pytest.mark.parametrize("copy_of", ["live", "older"])
def test_index_and_rebuild_refuse_a_mislabeled_live_version(tmp_path, copy_of, writer):
    """``live``: CURRENT names a copy of the live version V2 under a newer id (was: the index run pruned V2 and kept
    the copy as its only rollback); ``older``: a copy of V1 named between V1 and V2 (was: V2 removed as newer than the
    live version)."""
    out = tmp_path / "out"
    v1, v2 = _published(tmp_path, 2)
    source, name = (v2, "v000009-20261205T000000Z") if copy_of == "live" else (v1, f"{v1[:7]}-99991231T235959Z")
    shutil.copytree(out / "versions" / source, out / "versions" / name)
    _point(out, name)
    _shard(tmp_path / "data", 3)
    result = _index(tmp_path) if writer == "index" else _run("rebuild", out, "--index-factory", "Flat")
    assert result.exit_code == 65, result.output
    said = result.output
    assert f"CURRENT names {name}" in said and f"{name}/manifest.json records version \"{source}\"" in said, said
    assert f"echo {v2} >" in said and "Traceback" not in said, said
    assert _versions(out) == sorted([v1, v2, name]) and _live(out) == name  # nothing deleted, nothing published

    # --full builds without reading the live version: the real versions stay the rollback ones, the copy is kept
    result = _index(tmp_path, "--full")
    assert result.exit_code == 0, result.output
    new = _live(out)
    assert new not in (v1, v2, name)
    assert v2 in _versions(out) and name in _versions(out), _versions(out)
    assert v1 not in _versions(out)  # --keep-versions 2: the live version and V2
    assert f"{name}" in result.output and "not counted" in result.output, result.output


@pytest.mark.parametrize("writer", ["index", "rebuild"])
def test_pruning_never_counts_a_mislabeled_older_version(tmp_path, writer):
    """A copy of V2 named between V2 and V3 (the live version): with --keep-versions 3 the run kept it and V3 and
    deleted V2 (was); now V2 and V3 are the rollback versions, the copy stays on disk (said), V1 goes."""
    out = tmp_path / "out"
    v1, v2, v3 = _published(tmp_path, 3)
    assert v1 < v2 < v3
    copy = f"{v2[:7]}-99991231T235959Z"
    shutil.copytree(out / "versions" / v2, out / "versions" / copy)
    if writer == "index":
        _shard(tmp_path / "data", 4)
        result = _index(tmp_path, "--keep-versions", 3)
    else:
        result = _run("rebuild", out, "--index-factory", "Flat", "--keep-versions", 3)
    assert result.exit_code == 0, result.output
    new = _live(out)
    assert _versions(out) == sorted([v2, copy, v3, new]), _versions(out)
    assert f"{copy}/manifest.json records version \"{v2}\"" in result.output, result.output
    assert "not counted" in result.output
    if writer == "rebuild":
        manifest = json.loads((out / "versions" / new / "manifest.json").read_text())
        assert manifest.get("rebuilt_from") == v3, manifest.get("rebuilt_from")


def test_a_version_moved_past_the_live_one_is_no_leftover(tmp_path):
    """``mv versions/V1 versions/V9`` (CURRENT still V2): the next run removed V9 as a version never made live, and
    with it the only copy of V1's index. Now it stays (said, once), and is no rollback version either."""
    out = tmp_path / "out"
    v1, v2 = _published(tmp_path, 2)
    moved = "v000009-20261205T000000Z"
    os.rename(out / "versions" / v1, out / "versions" / moved)
    _shard(tmp_path / "data", 3)
    result = _index(tmp_path, "--keep-versions", 2)
    assert result.exit_code == 0, result.output
    assert _versions(out) == sorted([v2, moved, _live(out)]), _versions(out)
    assert result.output.count(f"{moved}/manifest.json records version \"{v1}\"") == 1, result.output


def test_a_text_index_run_refuses_a_mislabeled_live_version(tmp_path_factory, tmp_path):
    """The same refusal in a run that embeds text (its own code path: ``live_or_refuse``), before the model loads."""
    out = copy_sample_out(tmp_path_factory, tmp_path / "out")
    live = _live(out)
    copied = "v000009-20261205T000000Z"
    shutil.copytree(out / "versions" / live, out / "versions" / copied)
    _point(out, copied)
    result = _run("index", SAMPLE_DATA, "--out", out, "-q")
    assert result.exit_code == 65, result.output
    assert f"{copied}/manifest.json records version \"{live}\"" in result.output and f"echo {live} >" in result.output
    assert _versions(out) == sorted([live, copied]) and _live(out) == copied
