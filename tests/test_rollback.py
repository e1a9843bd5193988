"""``petal versions OUT`` lists the versions on disk; ``petal rollback OUT [VERSION]`` makes one live. Before, the only
way back was the hand edit ``echo vOLD > OUT/CURRENT``: not atomic (a reader or ``petal serve`` could see an empty or
cut pointer), no check that vOLD is a whole version of OUT, no lock (a run in progress could publish over it), and no
way to list the versions there.

Real components: ``petal index`` runs with the fake engine (tests/fake_engine.py), ``petal query`` on the version made
live, the writer lock, and ``petal serve`` (the packaged model) on a loopback port following a rollback."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from petal.pipeline.layout import OutputDir
from tests.fake_cli import invoke
from tests.fake_engine import embedded_ids, make_fake_model_dir


def _runs(tmp_path: Path, count: int = 3) -> tuple[Path, list[str]]:
    """OUT after ``count`` index runs, each adding a shard of two documents (``--keep-versions 3``); its versions."""
    model = make_fake_model_dir(tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir()
    versions = []
    for i in range(count):
        pq.write_table(pa.table({"id": [f"d{i}a", f"d{i}b"], "text": [f"doc {i} a", f"doc {i} b"]}),
                       data / f"s{i}.parquet")
        result = _index(tmp_path, model)
        assert result.exit_code == 0, result.output
        versions.append(_current(tmp_path / "out"))
    return tmp_path / "out", versions


def _index(tmp_path: Path, model: Path | None = None):
    model = model or tmp_path / "model"
    return invoke(["index", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "-q", "--model", str(model),
                   "--keep-versions", "3"], env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "fake.log")})


def _current(out: Path) -> str:
    return (out / "CURRENT").read_text().strip()


def _queried_ids(tmp_path: Path, out: Path) -> list[str]:
    """Every id ``petal query OUT`` answers for a vector of the live version (k above the documents)."""
    np.save(tmp_path / "q.npy", IndexReader(out).index.reconstruct(0)[None, :])
    result = invoke(["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "50", "--json"])
    assert result.exit_code == 0, result.output
    return sorted(hit["id"] for hit in json.loads(result.stdout)["hits"])


def test_versions_lists_newest_first_with_the_live_one(tmp_path):
    out, (v1, v2, v3) = _runs(tmp_path)
    result = invoke(["versions", str(out)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [v3, v2, v1]
    assert lines[0].split()[1] == "live" and "6 vectors" in lines[0] and "Flat" in lines[0]
    assert "live" not in lines[1] and "4 vectors" in lines[1] and "2 vectors" in lines[2]
    shown = invoke(["versions", str(out), "--json"])
    assert shown.exit_code == 0, shown.output
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(r["version"], r["live"], r["num_vectors"], r["factory"], r["ok"]) for r in rows] == [
        (v3, True, 6, "Flat", True), (v2, False, 4, "Flat", True), (v1, False, 2, "Flat", True)]
    assert all(r["created_at"] for r in rows)


def test_versions_marks_a_version_that_is_not_whole(tmp_path):
    out, (v1, v2, v3) = _runs(tmp_path)
    (out / "versions" / v1 / "manifest.json").write_text("{cut")
    shutil.rmtree(out / "versions" / v2)
    shutil.copytree(out / "versions" / v3, out / "versions" / v2)  # v2's name, v3's manifest
    rows = {r["version"]: r for r in map(json.loads, invoke(["versions", str(out), "--json"]).stdout.splitlines())}
    assert rows[v3]["ok"] and not rows[v2]["ok"] and not rows[v1]["ok"]
    assert "records version" in rows[v2]["problem"] and "manifest" in rows[v1]["problem"]
    plain = invoke(["versions", str(out)])
    assert plain.exit_code == 0 and "Traceback" not in plain.output
    assert sum("NOT WHOLE" in line for line in plain.stdout.splitlines()) == 2


@pytest.mark.parametrize("command", ["versions", "rollback"])
def test_an_out_that_holds_no_index_is_78_as_petal_info_says_it(tmp_path, command):
    for path in (tmp_path / "missing", tmp_path):
        result = invoke([command, str(path)])
        info = invoke(["info", str(path)])
        assert result.exit_code == info.exit_code == 78, result.output
        assert "is not a petal index" in result.output


def test_rollback_default_goes_to_the_previous_version_and_queries_answer_from_it(tmp_path):
    out, (v1, v2, v3) = _runs(tmp_path)
    result = invoke(["rollback", str(out)])
    assert result.exit_code == 0, result.output
    assert f"{v3} -> {v2}" in result.output
    assert _current(out) == v2
    assert _queried_ids(tmp_path, out) == ["d0a", "d0b", "d1a", "d1b"]
    assert sorted(os.listdir(out / "versions")) == [v1, v2, v3]  # nothing removed: v3 is the way forward
    again = invoke(["rollback", str(out)])
    assert again.exit_code == 0 and f"{v2} -> {v1}" in again.output and _current(out) == v1


def test_rollback_to_an_explicit_version_then_forward_again(tmp_path):
    out, (v1, _, v3) = _runs(tmp_path)
    assert invoke(["rollback", str(out), v1]).exit_code == 0
    assert _current(out) == v1 and _queried_ids(tmp_path, out) == ["d0a", "d0b"]
    forward = invoke(["rollback", str(out), v3])
    assert forward.exit_code == 0, forward.output
    assert f"{v1} -> {v3}" in forward.output and _current(out) == v3
    assert len(_queried_ids(tmp_path, out)) == 6


def test_the_live_version_again_changes_nothing(tmp_path):
    out, (_, _, v3) = _runs(tmp_path)
    before = os.stat(out / "CURRENT")
    result = invoke(["rollback", str(out), v3])
    assert result.exit_code == 0 and "nothing changed" in result.output, result.output
    assert os.stat(out / "CURRENT").st_ino == before.st_ino


def test_rollback_without_an_older_version_is_78_and_changes_nothing(tmp_path):
    out, (v1,) = _runs(tmp_path, count=1)
    result = invoke(["rollback", str(out)])
    assert result.exit_code == 78 and "no whole version older than the live one" in result.output, result.output
    assert _current(out) == v1


def test_an_unknown_or_damaged_version_is_78_naming_it_and_the_whole_ones(tmp_path):
    out, (v1, v2, v3) = _runs(tmp_path)
    unknown = "v000042-20260101T000000Z"
    result = invoke(["rollback", str(out), unknown])
    assert result.exit_code == 78 and unknown in result.output and "not in" in result.output, result.output
    assert v3 in result.output and v2 in result.output and v1 in result.output
    (out / "versions" / v2 / "manifest.json").write_text("{cut")
    damaged = invoke(["rollback", str(out), v2])
    assert damaged.exit_code == 78 and f"{v2} is no whole version" in damaged.output, damaged.output
    assert v1 in damaged.output.split("newest first:")[1] and v2 not in damaged.output.split("newest first:")[1]
    default = invoke(["rollback", str(out)])  # the damaged v2 is passed over
    assert default.exit_code == 0 and f"{v3} -> {v1}" in default.output, default.output
    (out / "versions" / v3 / "index.faiss").write_bytes(b"")
    cut = invoke(["rollback", str(out), v3])
    assert cut.exit_code == 78 and "index.faiss" in cut.output and _current(out) == v1, cut.output
    assert invoke(["rollback", str(out), "latest"]).exit_code == 2


def test_a_copied_version_is_refused(tmp_path):
    out, (v1, v2, v3) = _runs(tmp_path)
    shutil.rmtree(out / "versions" / v2)
    shutil.copytree(out / "versions" / v1, out / "versions" / v2)  # v2's name, v1's index
    result = invoke(["rollback", str(out), v2])
    assert result.exit_code == 78 and "records version" in result.output and _current(out) == v3, result.output


def test_the_next_index_run_starts_from_the_rolled_back_version(tmp_path):
    out, (v1, v2, v3) = _runs(tmp_path)
    assert invoke(["rollback", str(out), v2]).exit_code == 0
    (tmp_path / "fake.log").unlink()
    result = _index(tmp_path)
    assert result.exit_code == 0, result.output
    assert embedded_ids(tmp_path / "fake.log") == []  # s2's embeddings come from the store
    v4 = _current(out)
    assert v4 > v3 and f"removed {v3}" in result.output, result.output  # newer than the version rolled back to
    manifest = json.loads((out / "versions" / v4 / "manifest.json").read_text())
    assert manifest["index"]["num_vectors"] == 6
    assert sorted(os.listdir(out / "versions")) == [v1, v2, v4]


def test_a_run_holding_the_lock_refuses_the_rollback(tmp_path):
    out, (_, v2, v3) = _runs(tmp_path)
    with OutputDir(out).lock():
        result = invoke(["rollback", str(out), v2])
    assert result.exit_code == 75 and "is being written by another petal" in result.output, result.output
    assert _current(out) == v3


def test_petal_serve_follows_a_rollback(tmp_path_factory, tmp_path):
    """A real server on the newer version serves the older one once it is rolled back to, and the newer one again
    after a roll forward."""
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from tests._serve_shared import copy_sample_out
    from tests.test_serve import Server, cli_run
    from tests.test_serve_vectors_only import _wait_ready

    out = copy_sample_out(tmp_path_factory, tmp_path / "out")
    older = _current(out)
    cli_run("rebuild", out, "--index-factory", "HNSW8")
    newer = _current(out)
    server = Server(tmp_path / "server.log", out, "--reload-interval-s", "0.1")
    try:
        assert server.client.get("/ready").json()["version"] == newer
        cli_run("rollback", out)
        _wait_ready(server, lambda r: r["version"] == older and "refused" not in r, "the rollback", 20)
        cli_run("rollback", out, newer)
        _wait_ready(server, lambda r: r["version"] == newer and "refused" not in r, "the roll forward", 20)
    finally:
        server.stop()
    assert server.proc.returncode == 0


def test_a_current_that_names_no_version_is_repaired_by_naming_one(tmp_path):
    """The hand edit's other use: CURRENT emptied or cut. ``petal versions`` still lists (a warning says why none is
    live); ``petal rollback OUT`` without VERSION has no live version to go back from (78, naming the whole ones);
    with VERSION it makes it live."""
    out, (_, v2, v3) = _runs(tmp_path)
    (out / "CURRENT").write_text("")
    listed = invoke(["versions", str(out)])
    assert listed.exit_code == 0 and "no version is live" in listed.output and v3 in listed.stdout, listed.output
    assert invoke(["rollback", str(out)]).exit_code == 78
    result = invoke(["rollback", str(out), v2])
    assert result.exit_code == 0 and f"none -> {v2}" in result.output and _current(out) == v2, result.output
