"""A damaged or odd output directory (RELIABILITY.md promise 17, issue 12 items 1, 4, 8, 9, 16):
a pointer naming a missing version, symlinks out of OUT, FIFOs and directories where files belong,
a damaged live version. Real processes (forkrun), the fake engine, a timeout on every run (a FIFO
that blocks fails the test instead of hanging it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from petal.pipeline.layout import OutputDir
from tests import forkrun
from tests.fake_engine import embedded_ids, make_fake_model_dir

ROWS = 8
SECRET = "TOP-SECRET-LINE v000001-20000101T000000Z"
TIMEOUT_S = 90


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


class Job:
    def __init__(self, root: Path, model: Path, fresh: bool = True) -> None:
        """``fresh``: make DATA (shards a, b); else ``root`` already holds DATA, OUT and the files of one run."""
        self.root, self.model = root, model
        self.data, self.out = root / "data", root / "out"
        self.count = 0 if fresh else 1
        if fresh:
            self.data.mkdir()
            self.write("ab")

    def write(self, names: str, salt: int = 0) -> None:
        for name in names:
            pq.write_table(pa.table({"id": [f"{name}-{salt}-{i}" for i in range(ROWS)],
                                     "text": [f"{name} words {i} edition {salt}" for i in range(ROWS)]}),
                           self.data / f"{name}.parquet")

    def run(self, *extra: str, command: str = "index", fault: str | None = None) -> forkrun.Result:
        self.count += 1
        self.report = self.root / f"report-{self.count}.json"
        self.log = self.root / f"fake-{self.count}.jsonl"
        if command == "index":
            argv = ["index", str(self.data), "--out", str(self.out), "--model", str(self.model), "-q",
                    "--json-report", str(self.report), *extra]
        else:
            argv = [command, *extra]
        result = forkrun.petal(argv, {"PETAL_TEST_FAKE_ENGINE": str(self.log), "PETAL_FAULT": fault},
                               timeout=TIMEOUT_S)
        assert "Traceback" not in result.stderr, result.stderr
        return result

    def live_dir(self) -> Path:
        out = OutputDir(self.out)
        return out.versions_dir / out.current_version()


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, fake_model) -> tuple[Path, Path]:
    """``(home, pristine)``: a job's first run (``petal index`` of shards a, b) in ``home``, and a copy of ``home``
    right after it. Every ``job`` is that copy put back in ``home``: the store records the shards' paths, so DATA
    stays where the first run read it."""
    root = tmp_path_factory.mktemp("job")
    home = root / "home"
    home.mkdir()
    assert Job(home, fake_model).run().rc == 0
    shutil.copytree(home, root / "pristine", symlinks=True)
    return home, root / "pristine"


@pytest.fixture
def job(first_run, fake_model) -> Job:
    """A job after its first run (``first_run``'s copy, restored: mtimes kept, so nothing looks changed)."""
    home, pristine = first_run
    shutil.rmtree(home)
    shutil.copytree(pristine, home, symlinks=True)
    return Job(home, fake_model, fresh=False)


def secret_file(tmp_path: Path) -> Path:
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET + "\n")
    return secret


# --- item 1: a pointer naming a missing version ---------------------------------------------------

@pytest.mark.parametrize("pointer", ["v000000-20000101T000000Z", "v999999-20991231T000000Z", "garbage\n",
                                     ""])
def test_a_bad_pointer_deletes_nothing_and_says_how_to_recover(job, pointer):
    job.write("b", salt=1)
    assert job.run().rc == 0  # two versions now
    out = OutputDir(job.out)
    versions = out.versions()
    assert len(versions) == 2
    out.current_file.write_text(pointer)
    result = job.run()
    assert result.rc == 78 and "nothing was deleted" in result.last_line and versions[-1] in result.last_line
    assert out.versions() == versions  # every version is still there
    assert result.report["status"] == "failed"
    out.current_file.write_text(versions[-1] + "\n")  # the recovery the message names
    again = job.run()
    assert again.rc == 0 and again.report["status"] == "nothing-to-do"


@pytest.mark.parametrize("pointer", ["v000009-20000101T000000Z", "garbage"])
def test_the_rebuild_the_hint_names_reuses_the_store(job, pointer):
    """No version left that opens (versions/ lost, the store kept): the hint's rebuild embeds nothing again. It said
    'rebuild with petal index --full', which embeds every shard again though the store holds them all."""
    before = IndexReader(job.out).ids.column("id").to_pylist()
    shutil.rmtree(job.out / "versions")
    (job.out / "versions").mkdir()
    (job.out / "CURRENT").write_text(pointer + "\n")
    refused = job.run()
    hint = f"remove {job.out / 'CURRENT'} and rebuild with petal index, which reuses the embeddings in the store"
    assert refused.rc == 78 and hint in refused.last_line, refused.last_line
    (job.out / "CURRENT").unlink()  # as the hint says
    result = job.run()
    assert result.rc == 0 and result.report["status"] == "success", result.stderr
    assert embedded_ids(job.log) == []
    assert IndexReader(job.out).ids.column("id").to_pylist() == before


def test_the_recovery_hint_names_a_complete_version_not_the_broken_one(job):
    """CURRENT names an entry of versions/ that is no version directory (a plain file): the hint's ``echo``
    names the newest complete version, never the broken entry."""
    job.write("b", salt=1)
    assert job.run().rc == 0
    out = OutputDir(job.out)
    complete = out.versions()[-1]
    bad = out.new_version_id()
    (out.versions_dir / bad).write_text("not a version")
    out.current_file.write_text(bad + "\n")
    result = job.run()
    assert result.rc in (65, 78) and "nothing was deleted" in result.last_line, result.last_line
    assert f"echo {complete} >" in result.last_line and f"echo {bad}" not in result.last_line, result.last_line


MANIFEST_DAMAGE = ["missing", "empty", "not JSON", "not an object", "directory", "fifo"]


def _damage_manifest(path: Path, damage: str, tmp_path: Path) -> None:
    if damage in ("directory", "fifo"):
        plant(path, damage, tmp_path)
    else:
        {"missing": path.unlink, "empty": lambda: path.write_bytes(b""), "not JSON": lambda: path.write_text("{x"),
         "not an object": lambda: path.write_text("[]")}[damage]()


@pytest.mark.parametrize("damage", MANIFEST_DAMAGE)
def test_a_live_version_without_a_readable_manifest_names_the_way_back(job, tmp_path, damage):
    """CURRENT names a version directory whose manifest is missing, empty, not JSON or not a file: opening,
    query, info and verify refuse it (78) with the hint a bad pointer gets, naming the complete version before
    it (they used to say only "rebuild"); nothing is deleted, and the hint's command is the way back."""
    import petal

    job.write("b", salt=1)
    assert job.run().rc == 0
    out = OutputDir(job.out)
    older, live = out.versions()
    _damage_manifest(out.versions_dir / live / "manifest.json", damage, tmp_path)
    hint = f"echo {older} > "
    for argv in (["query", "x"], ["info"], ["verify"], ["verify", "--version", live], ["verify", "--json"]):
        result = job.run(str(job.out), *argv[1:], command=argv[0])
        said = result.stderr + result.stdout
        assert result.rc == 78 and "nothing was deleted" in said and hint in said, (argv, said)
        assert f"echo {live}" not in said and "manifest.json" in result.last_line, (argv, said)
    assert json.loads(result.stdout)["exit_code"] == 78  # verify --json: one object, the hint in its error
    with pytest.raises(petal.PetalError, match="nothing was deleted") as refused:
        petal.open_index(job.out)
    assert refused.value.exit_code == 78 and hint in str(refused.value)
    assert out.versions() == [older, live]
    out.current_file.write_text(older + "\n")  # what the hint says
    assert job.run(str(job.out), command="verify").rc == 0


def test_full_with_a_bad_pointer_publishes_without_deleting_newer_versions(job):
    out = OutputDir(job.out)
    live = out.current_version()
    out.current_file.write_text("v000000-20000101T000000Z\n")
    result = job.run("--full")
    assert result.rc == 0 and out.current_version() > live
    assert live in out.versions()  # kept as a rollback target (--keep-versions 2)


# --- items 8, 9: symlinks out of OUT, FIFOs, directories, devices where a file belongs ------------

def plant(path: Path, kind: str, tmp_path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if kind == "symlink-out":
        path.symlink_to(secret_file(tmp_path))
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()


KINDS = ["symlink-out", "device", "fifo", "directory"]


@pytest.mark.parametrize("kind", KINDS)
def test_current_is_never_followed_out_echoed_or_blocking(job, tmp_path, kind):
    plant(job.out / "CURRENT", kind, tmp_path)
    started = time.monotonic()
    result = job.run()
    assert result.rc == 78, result.stderr
    assert time.monotonic() - started < TIMEOUT_S
    assert "TOP-SECRET" not in result.stderr and "TOP-SECRET" not in json.dumps(result.report)
    assert len(OutputDir(job.out).versions()) == 1  # nothing deleted
    for command in (["info", str(job.out)], ["query", str(job.out), "x"]):
        reader = job.run(*command[1:], command=command[0])
        assert reader.rc in (65, 78) and "TOP-SECRET" not in reader.stderr + reader.stdout, reader.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_a_planted_manifest_is_refused_by_index_and_readers(job, tmp_path, kind):
    plant(job.live_dir() / "manifest.json", kind, tmp_path)
    result = job.run()
    assert result.rc == 78 and "manifest" in result.last_line and "TOP-SECRET" not in result.stderr
    info = job.run(str(job.out), command="info")
    assert info.rc == 78 and "TOP-SECRET" not in info.stderr + info.stdout


@pytest.mark.parametrize("name", ["index.faiss", "ids.parquet"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_planted_index_file_is_refused_by_readers_and_repaired_by_index(job, tmp_path, name, kind):
    ids_before, _ = IndexReader(job.out).ids, None
    plant(job.live_dir() / name, kind, tmp_path)
    with pytest.raises(Exception) as refused:
        IndexReader(job.out)
    assert "TOP-SECRET" not in str(refused.value)
    result = job.run()
    assert result.rc == 0 and result.report["status"] == "success" and result.report["repaired"]
    assert embedded_ids(job.log) == []  # rebuilt from the store, nothing embedded again
    assert IndexReader(job.out).ids.column("id").to_pylist() == ids_before.column("id").to_pylist()


@pytest.mark.parametrize("name", ["entry.json", "embeddings.npy", "rows.parquet"])
@pytest.mark.parametrize("kind", [*KINDS, "garbage", "truncated"])
def test_a_damaged_store_entry_is_embedded_again_and_refused_by_rebuild(job, tmp_path, name, kind):
    entry = next(e.parent for e in (job.out / "store" / "shards").glob("*/*/entry.json")
                 if json.loads(e.read_text())["source"]["path"].endswith("a.parquet"))  # shard a stays unchanged
    target = entry / name
    if kind == "garbage":
        target.write_bytes(b"\x00garbage{")
    elif kind == "truncated":
        target.write_bytes(target.read_bytes()[: max(1, target.stat().st_size // 2)])
    else:
        plant(target, kind, tmp_path)
    rebuilt = job.run(str(job.out), command="rebuild")
    assert rebuilt.rc == 65 and str(entry) in rebuilt.stderr and "TOP-SECRET" not in rebuilt.stderr
    job.write("b", salt=2)  # a change, so the run builds a version from the store entries
    result = job.run()
    assert result.rc == 0, result.stderr
    assert "damaged" in result.stderr and "TOP-SECRET" not in result.stderr
    assert len(embedded_ids(job.log)) == 2 * ROWS  # the damaged shard and the changed one
    assert IndexReader(job.out).ntotal == 2 * ROWS


def _stored_text(out: Path) -> list:
    reader = IndexReader(out)
    return reader.columns.rows(list(range(reader.ntotal)), ["text"])


def test_rebuild_keeps_the_stored_text_when_the_store_side_files_are_gone(job):
    """Store side files removed by hand (or a backup restored without them): a rebuild copies the stored
    text from the previous version (same rows, same order), named on stderr, instead of publishing a
    version without it; with the previous version's copy unusable too it refuses (65) and names the file."""
    want = _stored_text(job.out)
    assert len(want) == 2 * ROWS and all(row["text"] for row in want)
    side_files = sorted((job.out / "store" / "columns").glob("*/*.parquet"))
    assert side_files
    for path in side_files:
        path.unlink()
    before = job.live_dir()
    rebuilt = job.run(str(job.out), "--index-factory", "Flat", command="rebuild")
    assert rebuilt.rc == 0, rebuilt.stderr
    assert "copied from version" in rebuilt.stderr and before.name in rebuilt.stderr
    assert job.live_dir() != before and _stored_text(job.out) == want
    verified = job.run(str(job.out), command="verify")
    assert verified.rc == 0, verified.stderr
    # the previous version without its text column as well: nothing to copy from, so no version at all
    live = job.live_dir()
    ids = pq.read_table(live / "ids.parquet")
    pq.write_table(ids.drop_columns(["text"]), live / "ids.parquet")
    refused = job.run(str(job.out), command="rebuild")
    assert refused.rc == 65 and "would lose their text" in refused.last_line, refused.stderr
    assert job.live_dir() == live
    again = job.run("--full")  # what the message says: petal index writes the side files again
    assert again.rc == 0, again.stderr
    assert sorted((job.out / "store" / "columns").glob("*/*.parquet")) and _stored_text(job.out) == want


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink-out"])
def test_lock_file_that_is_not_a_regular_file_is_73(job, tmp_path, kind):
    plant(job.out / ".lock", kind, tmp_path)
    result = job.run()
    assert result.rc == 73 and ".lock" in result.last_line
    rebuilt = job.run(str(job.out), command="rebuild")
    assert rebuilt.rc == 73
    assert (tmp_path / "secret.txt").read_text().strip() == SECRET if kind == "symlink-out" else True


def test_a_fifo_as_rejects_of_the_live_version_never_blocks_rebuild(job):
    rejects = job.live_dir() / "rejects.parquet"
    rejects.unlink()
    os.mkfifo(rejects)
    result = job.run(str(job.out), command="rebuild")
    assert result.rc == 78 and "rejects.parquet" in result.last_line


# --- item 4: a damaged live version is rebuilt from the store ------------------------------------

DAMAGE = {
    "index.faiss garbage": lambda d: (d / "index.faiss").write_bytes(b"garbage"),
    "ids.parquet deleted": lambda d: (d / "ids.parquet").unlink(),
    "index.faiss one byte flipped": lambda d: _flip(d / "index.faiss"),
    "ids.parquet truncated": lambda d: (d / "ids.parquet").write_bytes((d / "ids.parquet").read_bytes()[:-30]),
}


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_rerun_that_finds_the_live_version_damaged_rebuilds_it(job, damage):
    ids = IndexReader(job.out).ids.column("id").to_pylist()
    live = OutputDir(job.out).current_version()
    DAMAGE[damage](job.live_dir())
    result = job.run()
    assert result.rc == 0 and result.report["status"] == "success" and result.report["repaired"], result.stderr
    assert OutputDir(job.out).current_version() != live and embedded_ids(job.log) == []
    assert IndexReader(job.out).ids.column("id").to_pylist() == ids
    assert job.run().report["status"] == "nothing-to-do"


# --- item 16: a checksum that matches a corrupt file, a tampered manifest field -------------------

def _retamper(version_dir: Path, name: str, data: bytes) -> None:
    import hashlib

    (version_dir / name).write_bytes(data)
    manifest = json.loads((version_dir / "manifest.json").read_text())
    manifest["index"]["files"][name] = hashlib.sha256(data).hexdigest()
    (version_dir / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("case, code", [("index.faiss", 65), ("ids.parquet", 65), ("storage", 78),
                                        ("search_params", 78), ("index section", 78)])
def test_readers_refuse_corrupt_files_with_matching_checksums_and_tampered_fields(job, case, code):
    version_dir = job.live_dir()
    if case in ("index.faiss", "ids.parquet"):
        data = (version_dir / case).read_bytes()
        _retamper(version_dir, case, data[:20] + b"\x00" * 40 + data[60:])
    else:
        manifest = json.loads((version_dir / "manifest.json").read_text())
        if case == "storage":
            manifest["index"]["storage"] = "/etc/passwd\npetal: success"
        elif case == "search_params":
            manifest["index"]["search_params"] = {"nprobe": "many"}
        else:
            manifest["index"] = "nope"
        (version_dir / "manifest.json").write_text(json.dumps(manifest))
    result = job.run(str(job.out), "some words", command="query")
    assert result.rc == code, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("petal: error: ")


# --- item 14: signals -----------------------------------------------------------------------------

@pytest.mark.parametrize("sig, code", [(signal.SIGHUP, 129), (signal.SIGUSR1, 138), (signal.SIGTERM, 143)])
def test_hup_and_usr_signals_stop_cleanly_with_the_report(tmp_path, fake_model, sig, code):
    job = Job(tmp_path, fake_model)
    report = tmp_path / "r.json"
    child = forkrun.start(["index", str(job.data), "--out", str(job.out), "--model", str(fake_model), "-q",
                           "--json-report", str(report)],
                          {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log"), "PETAL_FAULT": "after_lock:1:sleep=4"})
    _wait_for_lock(job.out, child)
    child.send(sig)
    result = child.wait(60)
    assert result.rc == code and result.report["status"] == "interrupted" and result.report["exit_code"] == code
    assert f"interrupted by {sig.name}" in result.last_line


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_a_signal_the_run_was_started_ignoring_stays_ignored(tmp_path, fake_model, sig):
    """``nohup petal index ... &`` (SIGHUP ignored from the start; a background job's SIGINT alike): the run's stop
    handling took the signal over, so the end of the ssh session stopped the run (129) that nohup was to keep going.
    Now an ignored signal stays ignored: the run publishes. A real process (``preexec_fn``: ignored before exec)."""
    job = Job(tmp_path, fake_model)
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_cli", "index", str(job.data), "--out", str(job.out), "--model",
         str(fake_model), "-q"], cwd=Path(__file__).resolve().parent.parent, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log"), "PETAL_FAULT": "after_lock:1:sleep=2"},
        preexec_fn=lambda: signal.signal(sig, signal.SIG_IGN))
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:  # NOTE: at start-up, under the lock and after
        process.send_signal(sig)
        time.sleep(0.1)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0 and err.strip().splitlines()[-1].startswith("petal index: success"), err


def test_a_second_signal_kills_at_once(tmp_path, fake_model):
    job = Job(tmp_path, fake_model)
    child = forkrun.start(["index", str(job.data), "--out", str(job.out), "--model", str(fake_model), "-q"],
                          {"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log"), "PETAL_FAULT": "after_lock:1:sleep=60"})
    _wait_for_lock(job.out, child)
    child.send(signal.SIGTERM)
    # NOTE: the second signal only after the first one's handler ran (it restores the default): a fixed 0.5 s was
    # a race on a loaded machine, where both could be pending before the process ran and merge into one
    child.wait_handled(signal.SIGTERM)
    child.send(signal.SIGTERM)
    result = child.wait(30)  # the first alone would stop only after the 60 s sleep
    assert result.rc == -signal.SIGTERM


def _wait_for_lock(out: Path, child: forkrun.Child) -> None:
    deadline = time.monotonic() + 60
    while not ((out / ".lock").exists() and str(child.pid) in (out / ".lock").read_text()):
        assert time.monotonic() < deadline and child.alive(), child.stderr_so_far()
        time.sleep(0.05)


def test_vectors_of_a_repaired_version_are_the_stored_ones(job):
    before = IndexReader(job.out)
    vectors = before.index.reconstruct_n(0, before.ntotal)
    (job.live_dir() / "index.faiss").write_bytes(b"garbage")
    assert job.run().rc == 0
    after = IndexReader(job.out)
    np.testing.assert_array_equal(after.index.reconstruct_n(0, after.ntotal), vectors)


@pytest.mark.parametrize("field, value", [("shards", "nope"), ("shards", [{"path": 1}]), ("embedding", None),
                                          ("index", [])])
def test_a_tampered_live_manifest_is_78_for_index_not_a_traceback(job, field, value):
    manifest_file = job.live_dir() / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    manifest[field] = value
    manifest_file.write_text(json.dumps(manifest))
    result = job.run()
    assert result.rc == 78 and "manifest.json" in result.last_line and "--full" in result.last_line
    assert job.run("--full").rc == 0
