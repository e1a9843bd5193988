"""``petal.versions(out)`` and ``petal.rollback(out, version=None, *, wait=False)``: the Python API of ``petal
versions`` and ``petal rollback``, which had none (a Python caller rolled back with the hand edit ``echo vOLD >
OUT/CURRENT``, or imported ``petal.pipeline.jobs.versions``, whose errors named the CLI's flags and whose stop
signals were nobody's). They take their arguments as the other API functions do (``""``, another URL, a wrong type:
``UsageError`` naming the keyword; ``file://`` the local path), raise the exit codes the commands exit with, and
``rollback`` takes SIGINT and SIGTERM while it waits for the lock as ``rebuild`` does.

Real components: ``petal.index`` runs with the fake engine (tests/fake_engine.py), real FAISS and Parquet, the
writer lock, and ``petal.open_index`` on the version made live."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.layout import OutputDir
from tests.fake_cli import invoke
from tests.fake_engine import fake_engine_factory, make_fake_model_dir


def _runs(tmp_path: Path, count: int = 3) -> tuple[Path, list[str]]:
    """OUT after ``count`` ``petal.index`` runs, each adding a shard of two documents (``keep_versions=3``)."""
    model = make_fake_model_dir(tmp_path / "model")
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    made = []
    for i in range(count):
        pq.write_table(pa.table({"id": [f"d{i}a", f"d{i}b"], "text": [f"doc {i} a", f"doc {i} b"]}),
                       data / f"s{i}.parquet")
        report = petal.index(data, out, model=str(model), engine_factory=fake_engine_factory(None), keep_versions=3,
                             quiet=True)
        assert report.status == "success", report.message
        made.append(report.version)
    return out, made


def _current(out: Path) -> str:
    return (out / "CURRENT").read_text().strip()


def test_versions_lists_newest_first_as_the_command_does(tmp_path):
    out, (v1, v2, v3) = _runs(tmp_path)
    entries = petal.versions(out)
    assert all(isinstance(e, petal.VersionEntry) for e in entries)
    assert [(e.version, e.live, e.num_vectors, e.factory, e.problem) for e in entries] == [
        (v3, True, 6, "Flat", None), (v2, False, 4, "Flat", None), (v1, False, 2, "Flat", None)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        entries[0].live = False  # type: ignore[misc]
    shown = invoke(["versions", str(out), "--json"])
    assert shown.exit_code == 0, shown.output
    assert [json.loads(line) for line in shown.stdout.splitlines()] == [e.as_dict() for e in entries]
    (out / "versions" / v1 / "manifest.json").write_text("{cut")
    damaged = petal.versions(str(out))[-1]
    assert damaged.version == v1 and damaged.problem and "manifest" in damaged.problem and not damaged.as_dict()["ok"]


def test_rollback_default_explicit_and_live_already_and_open_index_serves_the_version_made_live(tmp_path):
    out, (v1, v2, v3) = _runs(tmp_path)
    with petal.open_index(out) as before:
        assert before.path.name == v3 and before.num_vectors == 6
        done = petal.rollback(out)
        assert done == petal.Rollback(out, v3, v2, changed=True) and _current(out) == v2
        assert before.num_vectors == 6  # NOTE: an Index stays on the version it opened
    with petal.open_index(out) as after:
        assert after.path.name == v2 and after.num_vectors == 4
    assert petal.rollback(out, v1) == petal.Rollback(out, v2, v1, changed=True)
    with petal.open_index(out) as oldest:
        assert oldest.path.name == v1 and oldest.num_vectors == 2
    assert petal.rollback(out, version=v3).changed and _current(out) == v3  # a roll forward
    assert petal.rollback(out, v3) == petal.Rollback(out, v3, v3, changed=False)
    assert [e.version for e in petal.versions(out) if e.live] == [v3]


def test_an_unknown_version_or_no_version_id_raises_what_the_command_exits_with(tmp_path):
    out, (v1, _, v3) = _runs(tmp_path)
    gone = "v000009-20260101T000000Z"
    with pytest.raises(petal.ConfigError) as caught:
        petal.rollback(out, gone)
    result = invoke(["rollback", str(out), gone])
    assert caught.value.exit_code == result.exit_code == 78, result.output
    assert f"{gone} is no whole version" in str(caught.value) and "pruned, or never made" in str(caught.value)
    assert v3 in str(caught.value) and _current(out) == v3
    os.remove(out / "versions" / v1 / "ids.parquet")
    with pytest.raises(petal.ConfigError, match=f"{v1} is no whole version"):
        petal.rollback(out, v1)
    with pytest.raises(petal.UsageError) as caught:
        petal.rollback(out, "latest")
    result = invoke(["rollback", str(out), "latest"])
    assert caught.value.exit_code == result.exit_code == 2 and str(caught.value).startswith('version "latest" is not')
    with pytest.raises(petal.UsageError, match=rf"give its id: version {v1}"):
        petal.rollback(out, str(out / "versions" / v1))  # what ls shows: the id named, as the keyword
    with pytest.raises(TypeError, match=r"petal.rollback\(\): version=1 is an int, not str"):
        petal.rollback(out, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"petal.rollback\(\): wait='no' is a str, not bool"):
        petal.rollback(out, wait="no")  # type: ignore[arg-type]
    with pytest.raises(petal.UsageError, match=r"petal.rollback\(\) got an unexpected keyword argument 'versio'; did "
                                               r"you mean 'version'\?"):
        petal.rollback(out, versio=v1)  # type: ignore[call-arg]
    assert _current(out) == v3


@pytest.mark.parametrize("call", [petal.versions, petal.rollback], ids=["versions", "rollback"])
def test_an_out_that_holds_no_index_or_no_path(tmp_path, call):
    for path in (tmp_path / "missing", tmp_path):
        with pytest.raises(petal.ConfigError, match="is not a petal index") as caught:
            call(path)
        assert caught.value.exit_code == invoke([call.__name__, str(path)]).exit_code == 78
    for given, named in (("", r"^out: an empty path"), ("s3://bkt/idx", r"^out: s3://bkt/idx is a URL")):
        with pytest.raises(petal.UsageError, match=named):
            call(given)
    with pytest.raises(TypeError, match=r"out: 5 is an int, not a path"):
        call(5)
    with pytest.raises(petal.UsageError, match=rf"^petal.{call.__name__}\(\) missing 1 required positional"):
        call()


def test_file_urls_name_the_local_out(tmp_path):
    out, (_, v2, v3) = _runs(tmp_path, 2 + 1)
    assert [e.version for e in petal.versions(out.as_uri())][:2] == [v3, v2]
    assert petal.rollback(out.as_uri()) == petal.Rollback(out, v3, v2, changed=True)


def test_a_writer_holding_the_lock_refuses_the_rollback_as_it_refuses_rebuild(tmp_path):
    out, (_, v2, v3) = _runs(tmp_path)
    with OutputDir(out).lock():
        with pytest.raises(petal.TemporaryFailure) as refused:
            petal.rollback(out, v2)
        with pytest.raises(petal.TemporaryFailure) as rebuild_refused:
            petal.rebuild(out, quiet=True)
        assert petal.versions(out)[0].live  # reading takes no lock
    assert type(refused.value) is type(rebuild_refused.value) and refused.value.exit_code == 75
    assert "is being written by another petal" in str(refused.value)
    assert "wait=True" in str(refused.value) and "--wait" not in str(refused.value), str(refused.value)
    assert str(refused.value) == str(rebuild_refused.value)
    assert _current(out) == v3


def test_a_sigint_while_rollback_waits_for_the_lock_stops_it_and_gives_the_handler_back(tmp_path):
    """With ``wait=True`` behind another writer, SIGINT ends the wait (``Interrupted``, 130), as ``rebuild``'s; the
    caller's handler is as it was before the call, and nothing changed."""
    out, (_, v2, v3) = _runs(tmp_path)
    mine = signal.getsignal(signal.SIGINT)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    with OutputDir(out).lock():
        timer.start()
        try:
            with pytest.raises(petal.Interrupted) as stopped:
                petal.rollback(out, v2, wait=True, quiet=True)
        finally:
            timer.cancel()
    assert stopped.value.exit_code == 130 and signal.getsignal(signal.SIGINT) is mine
    assert _current(out) == v3
    assert petal.rollback(out, v2, wait=True).changed and _current(out) == v2  # the lock free: no wait
