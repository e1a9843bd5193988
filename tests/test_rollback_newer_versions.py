"""The versions newer than a live version set back by hand (``echo vOLD > OUT/CURRENT``, README "rollback") are the
way forward again: a run removes them only once it has published a version, and a hand rollback during a run is never
overwritten by its publish.

Before:
- every writer's clean-up removed them at its start, before any check: a run then refused (settings drift 78, the
  removal guard 65), failed, stopped or with nothing to do had deleted the newest versions;
- with the live version's ``manifest.json`` damaged (not JSON, a key missing), the clean-up took the pointer for a
  valid one: it deleted the good newer versions (the one ``petal info`` had just named to recover with, saying
  "nothing was deleted") and then refused the damaged one (78);
- a rollback by hand while a run built its version was overwritten by the publish's pointer swap, and its pruning
  could then remove the version rolled back to;
- a version kept because a reader held it was said to be in use by "a petal serve that serves it" only.

Real ``petal index``/``petal rebuild`` processes (tests/forkrun.py) over real Parquet, FAISS and store, with the
fake engine (deterministic vectors, no model weights).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir, VersionLease
from tests import forkrun
from tests.fake_engine import make_fake_model_dir
from tests.invariants import live

ROWS = 6


def write_shard(data: Path, name: str, edition: int) -> None:
    data.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [f"{name}-{edition}-{i}" for i in range(ROWS)],
                             "text": [f"{name} text {i} edition {edition} with some words" for i in range(ROWS)]}),
                   data / f"{name}.parquet")


class Out:
    """DATA (a.parquet, b.parquet) indexed into OUT; the runs on it (the fake engine; one report per run)."""

    def __init__(self, root: Path, models: dict[str, Path]) -> None:
        self.root, self.models = root, models
        self.data, self.out = root / "data", root / "out"
        self.count = 0

    def _report(self) -> Path:
        self.count += 1
        return self.root / f"report-{self.count}.json"

    def start(self, command: str, *extra: str | Path, model: str = "model",
              env: dict[str, str] | None = None) -> forkrun.Child:
        report = self._report()
        if command == "rebuild":
            argv = ["rebuild", str(self.out), "--json-report", str(report), *map(str, extra)]
        else:
            argv = ["index", str(self.data), "--out", str(self.out), "--model", str(self.models[model]),
                    "--max-seqs", "4", "--json-report", str(report), *map(str, extra)]
        fake = {"PETAL_TEST_FAKE_ENGINE": str(self.root / f"fake-{self.count}.jsonl")}
        return forkrun.start(argv, {**fake, **(env or {})})

    def run(self, command: str, *extra: str | Path, model: str = "model",
            env: dict[str, str] | None = None) -> forkrun.Result:
        return self.start(command, *extra, model=model, env=env).wait(300)

    def publishes(self, command: str = "index", *extra: str | Path) -> forkrun.Result:
        before = self.current()
        result = self.run(command, *extra)
        assert result.rc == 0 and result.report["status"] == "success", result.stderr
        assert self.current() == result.report["version"] != before
        return result

    def killed_at(self, point: str, *extra: str | Path) -> None:
        """``petal index`` killed (SIGKILL) at fault point ``point``."""
        killed = self.run("index", *extra, env={"PETAL_FAULT": f"{point}:1:kill"})
        assert killed.rc in (-9, 137), killed.stderr[-2000:]

    def current(self) -> str:
        version = OutputDir(self.out).current_version()
        assert version is not None
        return version

    def versions(self) -> list[str]:
        return OutputDir(self.out).versions()

    def roll_back(self, version: str) -> None:
        (self.out / "CURRENT").write_text(f"{version}\n")  # README "rollback"

    def manifest(self, version: str) -> Path:
        return self.out / "versions" / version / "manifest.json"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {"model": make_fake_model_dir(root / "model"), "model48": make_fake_model_dir(root / "model48", dim=48)}


@pytest.fixture
def three(tmp_path, models) -> tuple[Out, str, str, str]:
    """v1 from a and b (edition 1), then a's editions 2 and 3: v2, v3 (live; --keep-versions 3 keeps all three).
    DATA holds a's edition 3. Returns (out, v1, v2, v3)."""
    o = Out(tmp_path, models)
    write_shard(o.data, "b", 1)
    versions = []
    for edition in (1, 2, 3):
        write_shard(o.data, "a", edition)
        result = o.run("index", "--keep-versions", "3")
        assert result.rc == 0, result.stderr
        versions.append(o.current())
    assert o.versions() == versions
    v1, v2, v3 = versions
    return o, v1, v2, v3


@pytest.mark.parametrize("damage", ["not JSON", "a key missing"])
def test_a_damaged_live_version_set_back_by_hand_costs_no_newer_version(three, damage):
    """The pointer may be what is wrong: with the live version's manifest unreadable, no run deletes a version newer
    than it; the one ``petal info`` names to recover with is there, and the way forward works."""
    o, v1, v2, v3 = three
    o.roll_back(v1)
    manifest = o.manifest(v1)
    if damage == "not JSON":
        manifest.write_text("{")
    else:
        data = json.loads(manifest.read_text())
        del data["shards"]
        manifest.write_text(json.dumps(data))
    for command in ("index", "rebuild"):
        refused = o.run(command)
        assert refused.rc == 78 and refused.report["status"] == "failed", refused.stderr
        assert o.versions() == [v1, v2, v3] and refused.report["pruned"]["versions"] == [], refused.stderr
        assert "removed" not in refused.stderr, refused.stderr
    if damage == "not JSON":  # NOTE: a key missing is refused (78) naming the key, without the way back
        info = forkrun.petal(["info", str(o.out)])
        assert info.rc == 78 and "nothing was deleted" in info.stderr and f"echo {v3} >" in info.stderr, info.stderr
    o.roll_back(v3)  # what info says to do
    again = o.run("index")
    assert again.rc == 0 and again.report["status"] == "nothing-to-do", again.stderr
    live(o.out)


REFUSALS = {
    "settings drift (78)": (("--model", "model48"), None, 78),
    "the removal guard (65)": (("--sync",), "b", 65),
    "a failure (1)": ((), "fault:before_index_build:1:raise", 1),
    "a stop signal (143)": ((), "fault:before_index_build:1:term", 143),
    "nothing to do (0)": ((), "v1 data", 0),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_run_that_publishes_nothing_leaves_the_newer_versions(three, case):
    """Refused, failed, stopped or with nothing to publish: the versions newer than the live one stay (a publish
    removes them, said and reported, and they are not counted among --keep-versions)."""
    o, v1, v2, v3 = three
    extra, how, code = REFUSALS[case]
    o.roll_back(v1)
    env = {}
    model = "model"
    if extra and extra[0] == "--model":
        model, extra = extra[1], ()
    if how == "b":
        (o.data / "b.parquet").unlink()  # --sync would drop half the documents (over the 10% it allows)
    elif how == "v1 data":
        write_shard(o.data, "a", 1)
    elif how is not None:
        env["PETAL_FAULT"] = how.removeprefix("fault:")
    result = o.run("index", *extra, model=model, env=env)
    assert result.rc == code, (result.rc, result.stderr)
    assert o.versions() == [v1, v2, v3], (o.versions(), result.stderr)
    if result.report is not None:
        assert result.report["pruned"]["versions"] == [], result.report["pruned"]
    assert o.current() == v1

    write_shard(o.data, "a", 4)
    write_shard(o.data, "b", 1)
    published = o.publishes()
    v4 = o.current()
    assert o.versions() == [v1, v4], o.versions()  # --keep-versions 2: v1 is the one before v4
    assert published.report["pruned"]["versions"] == [v2, v3], published.report["pruned"]
    assert f"note: removed {v2}, {v3} (newer than the live version {v1} that {v4} was published over" \
        in published.stderr, published.stderr


def test_a_leftover_newer_directory_goes_at_once_but_never_while_the_live_manifest_is_damaged(three):
    """A directory newer than the live version that holds no whole version (no manifest) is a leftover, removed by
    the next writer's clean-up even when the run is refused; not while the live version's manifest does not read."""
    o, v1, v2, v3 = three
    o.roll_back(v1)
    junk = o.out / "versions" / "v000009-20200101T000000Z"
    junk.mkdir()
    (junk / "index.faiss").write_bytes(b"partial")
    good = o.manifest(v1).read_bytes()
    o.manifest(v1).write_text("{")
    refused = o.run("index")
    assert refused.rc == 78 and junk.is_dir() and o.versions() == [v1, v2, v3, junk.name], refused.stderr
    o.manifest(v1).write_bytes(good)
    drift = o.run("index", model="model48")  # refused (78), after the clean-up
    assert drift.rc == 78, drift.stderr
    assert o.versions() == [v1, v2, v3] and drift.report["pruned"]["versions"] == [junk.name], drift.stderr
    assert f"removed {junk.name} (newer than the live version {v1}, and no whole version" in drift.stderr


def wait_for_point(trace: Path, point: str, child: forkrun.Child) -> None:
    deadline = time.monotonic() + 120
    while point not in (trace.read_text() if trace.exists() else ""):
        assert child.alive(), child.stderr_so_far()[-2000:]
        assert time.monotonic() < deadline, f"{point} not reached: {child.stderr_so_far()[-2000:]}"
        time.sleep(0.02)


@pytest.mark.parametrize("command, point", [("index", "before_index_build"), ("index", "before_current_swap"),
                                            ("rebuild", "before_version_rename"), ("rebuild", "before_current_swap")])
def test_a_rollback_by_hand_during_a_run_is_never_overwritten(three, command, point):
    """CURRENT set back by hand while the run builds its version (or right before its pointer swap): nothing is
    published (75, safe to retry: the rerun starts from the rollback), the rolled-back version and every other stay."""
    o, v1, v2, v3 = three
    write_shard(o.data, "a", 4)
    trace = o.root / "trace"
    child = o.start(command, "--keep-versions", "1",
                    env={"PETAL_FAULT": f"{point}:1:sleep=4", "PETAL_FAULT_TRACE": str(trace)})
    wait_for_point(trace, point, child)
    with child.paused():
        o.roll_back(v1)
    result = child.wait(300)
    assert result.rc == 75, (result.rc, result.stderr)
    assert f"CURRENT changed during the run ({v3} -> {v1}, set by hand?): nothing published; run again" \
        in result.stderr, result.stderr
    report = result.report
    assert report["status"] == "failed" and report["exit_code"] == 75 and report["version"] is None, report
    assert report["pruned"]["versions"] == [] and "nothing published" in report["message"], report
    assert o.current() == v1 and o.versions() == [v1, v2, v3], o.versions()
    assert not [p.name for p in (o.out / "versions").iterdir() if p.name.startswith(".")]
    again = o.publishes(command, "--keep-versions", "1")  # run again: from v1, the newer ones go now
    assert o.versions() == [again.report["version"]] and again.report["pruned"]["versions"] == [v2, v3, v1]
    live(o.out)


def test_a_rollback_by_hand_right_after_a_publish_prunes_nothing(three):
    """CURRENT set back by hand between the pointer swap and the pruning: the pruning the publish owes is no longer
    the live version's (before: --keep-versions counted back from the version set by hand, and removed v1)."""
    o, v1, v2, v3 = three
    write_shard(o.data, "a", 4)
    trace = o.root / "trace"
    child = o.start("index", "--keep-versions", "1",
                    env={"PETAL_FAULT": "after_publish:1:sleep=4", "PETAL_FAULT_TRACE": str(trace)})
    wait_for_point(trace, "after_publish", child)
    with child.paused():
        v4 = o.current()
        o.roll_back(v2)
    result = child.wait(300)
    assert result.rc == 0 and result.report["version"] == v4, result.stderr
    assert o.versions() == [v1, v2, v3, v4] and result.report["pruned"]["versions"] == [], result.stderr
    assert f"names {v2}, not {v4} that was published (set by hand since?): no version pruned" in result.stderr


def test_a_run_killed_after_its_publish_leaves_the_newer_versions_to_the_next_run(three):
    """The versions newer than the one a run started from go with the pruning its publish owes (``.pruning``):
    killed before it, the next run finishes it, one that publishes nothing included."""
    o, v1, v2, v3 = three
    o.roll_back(v1)
    write_shard(o.data, "a", 4)
    o.killed_at("after_publish")
    v4 = o.current()
    assert v4 not in (v1, v2, v3) and o.versions() == [v1, v2, v3, v4], o.versions()
    owed = json.loads((o.out / ".pruning").read_text())
    assert owed == {"version": v4, "keep_versions": 2, "since": v1}, owed
    finish = o.run("index")
    assert finish.rc == 0 and finish.report["status"] == "nothing-to-do", finish.stderr
    assert o.versions() == [v1, v4] and finish.report["pruned"]["versions"] == [v2, v3], finish.stderr
    assert not (o.out / ".pruning").exists()


@pytest.mark.parametrize("command", ["index", "rebuild"])
def test_a_publish_after_a_killed_pruning_removes_what_that_pruning_owed_not_the_rollback_target(three, command):
    """A run killed after its publish (v4, over the rollback target v1) owes the removal of v2 and v3; the next run
    that publishes (v5, --keep-versions 3) ends with what an unkilled v4 then v5 ends with: v1, v4, v5. Was: the new
    publish replaced the record, counted v2 and v3 as rollback targets and pruned v1, the version rolled back to."""
    o, v1, v2, v3 = three
    o.roll_back(v1)
    write_shard(o.data, "a", 4)
    o.killed_at("after_publish", "--keep-versions", "3")
    v4 = o.current()
    assert o.versions() == [v1, v2, v3, v4], o.versions()
    if command == "index":
        write_shard(o.data, "a", 5)
    result = o.publishes(command, "--keep-versions", "3")
    v5 = o.current()
    assert o.versions() == [v1, v4, v5], (o.versions(), result.stderr)
    assert sorted(result.report["pruned"]["versions"]) == [v2, v3], result.report["pruned"]
    assert not (o.out / ".pruning").exists()


@pytest.mark.parametrize("then", ["publish", "nothing to do"])
def test_what_a_cut_short_pruning_owed_outlives_a_publish_killed_before_its_swap(three, then):
    """v4 published over the rollback target v1, its pruning killed (v2, v3 owed); v5's publish killed before its
    swap (its record replaced v4's). The next run still removes v2 and v3, never v1: a publish (v6, --keep-versions
    3) leaves v1, v4, v6; a run with nothing to do leaves v1 and v4. Was: the record of v5, never live, was dropped
    and v6's pruning counted v2 and v3 as rollback targets, removing v1."""
    o, v1, v2, v3 = three
    o.roll_back(v1)
    write_shard(o.data, "a", 4)
    o.killed_at("version_prune", "--keep-versions", "3")
    v4 = o.current()
    write_shard(o.data, "a", 5)
    o.killed_at("before_current_swap", "--keep-versions", "3")
    assert o.current() == v4 and {v1, v2, v3} <= set(o.versions()), o.versions()
    if then == "publish":
        write_shard(o.data, "a", 6)
        result = o.publishes("index", "--keep-versions", "3")
        assert [v for v in o.versions() if v <= v4] == [v1, v4] and o.versions()[-1] == o.current(), o.versions()
        assert len(o.versions()) == 3 and {v2, v3} <= set(result.report["pruned"]["versions"]), result.stderr
    else:
        write_shard(o.data, "a", 4)  # DATA as v4 was built from it: nothing to publish
        finish = o.run("index")
        assert finish.rc == 0 and finish.report["status"] == "nothing-to-do", finish.stderr
        assert [v for v in o.versions() if v <= v4] == [v1, v4], o.versions()


def test_a_newer_version_a_reader_holds_is_kept_and_said_with_every_kind_of_reader(three):
    o, v1, v2, v3 = three
    o.roll_back(v1)
    write_shard(o.data, "a", 4)
    with VersionLease(o.out / "versions" / v3) as lease:  # a petal.Index, petal serve, verify... still on v3
        assert lease.held
        published = o.publishes()
        v4 = o.current()
        assert o.versions() == [v1, v3, v4] and published.report["pruned"]["in_use"] == [v3], published.stderr
        assert published.report["pruned"]["versions"] == [v2], published.report["pruned"]
        assert (f"kept {v3} (newer than the live version {v1} that {v4} was published over): in use by a reader "
                "(a petal.Index still open on it, petal query --stdin, petal verify or info reading it, or a petal "
                "serve that still serves it); removed by a run after that reader lets it go") in published.stderr
    after = o.run("index")  # the reader gone: the pruning v4's publish owes is finished
    assert after.rc == 0 and after.report["status"] == "nothing-to-do", after.stderr
    assert o.versions() == [v1, v4] and after.report["pruned"]["versions"] == [v3], after.stderr
