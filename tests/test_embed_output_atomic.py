"""``petal embed --output`` is written whole or not at all, for every format it writes (.npy, .jsonl).

The rows go to a temporary file beside the target (same directory), fsynced, renamed over it. A run that fails
while writing (a disk error: here a real ``EFBIG`` from ``RLIMIT_FSIZE``; SIGTERM or SIGINT) leaves an existing
target as it was and no temporary file; the exit code is the failure's (74, 143, 130). Was: the target was
truncated in place first, so such a run left a partial file where the good one had been.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO

OLD = b"the good output of an earlier run\n"


def petal(args: list[str], cwd: Path, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **kwargs}
    return subprocess.Popen([sys.executable, "-m", "petal.cli.main", *args], cwd=cwd, env=env, text=True, **kwargs)


def texts(tmp_path: Path, count: int) -> Path:
    path = tmp_path / f"texts-{count}.txt"
    path.write_text("".join(f"text number {i} about glaciers and bread\n" for i in range(count)))
    return path


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


def being_written(directory: Path) -> bool:
    """A temporary file with rows in it beside the target. NOTE: not an empty one: before the model loads the
    output's file system is checked by creating and removing an empty temporary file there."""
    for name in leftovers(directory):
        try:
            if (directory / name).stat().st_size > 0:
                return True
        except FileNotFoundError:  # removed between the listing and the look
            pass
    return False


@pytest.mark.parametrize("suffix", [".npy", ".jsonl"])
def test_a_disk_error_while_writing_leaves_the_existing_output_untouched(tmp_path, suffix, minilm_dir):
    """A real write error: the process may not grow a file past 64 KiB (``RLIMIT_FSIZE``; Python ignores SIGXFSZ,
    so the write fails with EFBIG). 60 rows of 384 floats are more than that in either format."""
    target = tmp_path / f"out{suffix}"
    target.write_bytes(OLD)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    proc = petal(["embed", "--input", str(texts(tmp_path, 60)), "--output", str(target)], tmp_path,
                 preexec_fn=limit)
    _, stderr = proc.communicate(timeout=600)
    assert target.read_bytes() == OLD  # was: truncated, then 64 KiB of new rows
    assert leftovers(tmp_path) == []
    assert proc.returncode == 74, stderr[-2000:]
    assert f"cannot write --output {target}" in stderr


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_while_writing_leaves_the_existing_output_untouched(tmp_path, signum, code, minilm_dir):
    """The signal lands while the rows are being written: the process is stopped (SIGSTOP) the moment a
    temporary file shows up beside the target or the target itself changes, looked at, signalled, continued.
    A temporary file there means the rename has not happened: the target must come out as it was."""
    target = tmp_path / "out.jsonl"
    for count in (400, 1600, 4000):  # more rows, a longer write, if the write ended before it was seen
        target.write_bytes(OLD)
        before = target.stat()
        err = tmp_path / f"stderr-{count}.txt"  # NOTE: a file, not a pipe: the loop below reads nothing until the end
        with open(err, "w") as stderr_file:
            proc = petal(["embed", "--input", str(texts(tmp_path, count)), "--output", str(target)], tmp_path,
                         stdout=subprocess.DEVNULL, stderr=stderr_file)
        try:
            caught = False
            deadline = time.monotonic() + 300
            while proc.poll() is None:
                assert time.monotonic() < deadline, f"petal embed still running after 300 s: {err.read_text()[-2000:]}"
                now = target.stat()
                if being_written(tmp_path) or (now.st_ino, now.st_size, now.st_mtime_ns) != (
                        before.st_ino, before.st_size, before.st_mtime_ns):
                    proc.send_signal(signal.SIGSTOP)
                    caught = True
                    break
                time.sleep(0.001)
            if not caught:  # ended before anything was seen: a faster machine than the write needs
                continue
            temporary = leftovers(tmp_path)
            if not temporary and target.stat().st_ino != before.st_ino:  # renamed already: a complete file, again
                proc.send_signal(signal.SIGCONT)
                proc.wait(timeout=60)
                continue
            # NOTE: the old code wrote the target in place: it is already truncated or partly written here
            assert target.read_bytes() == OLD, "the target was changed in place before the run ended"
            proc.send_signal(signum)
            proc.send_signal(signal.SIGCONT)
            proc.wait(timeout=60)
            stderr = err.read_text()
            assert proc.returncode == code, stderr[-2000:]
            assert f"interrupted by {signal.Signals(signum).name} while writing --output {target}" in stderr
            assert target.read_bytes() == OLD
            assert leftovers(tmp_path) == []
            return
        finally:
            if proc.poll() is None:  # NOTE: a stopped (SIGSTOP) child too: SIGKILL ends it
                proc.kill()
                proc.wait()
    pytest.fail("the write was never caught in progress, even with 4000 rows")


@pytest.mark.parametrize("suffix", [".npy", ".jsonl"])
def test_a_good_run_replaces_the_output_whole_keeping_its_mode_and_symlink(tmp_path, suffix, minilm_dir):
    real = tmp_path / f"real{suffix}"
    real.write_bytes(OLD)
    real.chmod(0o640)
    link = tmp_path / f"link{suffix}"
    link.symlink_to(real.name)
    proc = petal(["embed", "one text", "two texts", "--output", str(link)], tmp_path)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-2000:]
    assert link.is_symlink() and os.readlink(link) == real.name  # the file it names was replaced, not the link
    assert real.stat().st_mode & 0o777 == 0o640
    if suffix == ".npy":
        assert np.load(real).shape == (2, 384)
    else:
        assert [json.loads(line)["index"] for line in real.read_text().splitlines()] == [0, 1]
    assert leftovers(tmp_path) == []


def test_a_run_that_fails_before_writing_leaves_the_output_untouched(tmp_path, minilm_dir):
    """Every text blank: no input (66); the output was never opened."""
    target = tmp_path / "out.npy"
    target.write_bytes(OLD)
    proc = petal(["embed", " ", "--output", str(target)], tmp_path)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 66, stderr[-2000:]
    assert target.read_bytes() == OLD and leftovers(tmp_path) == []


@pytest.mark.parametrize("suffix", [".npy", ".jsonl"])
def test_an_output_name_near_the_file_systems_limit_is_written(tmp_path, suffix, minilm_dir):
    """A name the file system takes (here 250 bytes, NAME_MAX 255) but ``.NAME.tmp-PID`` would not: was 74 'File name
    too long' after every text was embedded, the old file kept; a shell's ``> NAME`` writes it."""
    target = tmp_path / ("v" * (250 - len(suffix)) + suffix)
    target.write_bytes(OLD)
    proc = petal(["embed", "one text", "two texts", "--output", str(target)], tmp_path)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-2000:]
    if suffix == ".npy":
        assert np.load(target).shape == (2, 384)
    else:
        assert [json.loads(line)["index"] for line in target.read_text().splitlines()] == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no temporary file left


def test_an_output_name_longer_than_the_file_system_takes_is_73_before_the_model_loads(tmp_path):
    target = tmp_path / ("w" * 252 + ".npy")  # 256 bytes
    proc = petal(["embed", "one text", "--model", str(tmp_path / "no-model-here"), "--output", str(target)],
                 tmp_path)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 73, stderr[-2000:]  # was: 78 for the model (and, with one, 74 after embedding)
    assert "its name is 256 bytes, longer than the 255 its file system takes" in stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["dangling into a missing directory", "loop", "to a directory"])
def test_an_output_symlink_that_cannot_be_written_through_is_73_before_the_model_loads(tmp_path, kind):
    """Was 74 'No such file or directory' / 'Too many levels of symbolic links' after every text was embedded (the
    checks before the model looked at the link's directory only)."""
    link = tmp_path / "out.npy"
    if kind == "loop":
        (tmp_path / "other.npy").symlink_to(link.name)
        link.symlink_to("other.npy")
        said = "it is a loop of symbolic links"
    elif kind == "to a directory":
        (tmp_path / "dir").mkdir()
        link.symlink_to("dir")
        said = "it is a directory"
    else:
        link.symlink_to(tmp_path / "missing" / "real.npy")
        said = f"it is a symbolic link to {tmp_path / 'missing' / 'real.npy'}, which cannot be created"
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = petal(["embed", "one text", "--model", str(tmp_path / "no-model-here"), "--output", str(link)], tmp_path)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 73, stderr[-2000:]
    assert f"cannot create --output {link}: {said}" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_dangling_output_symlink_creates_the_file_it_names(tmp_path, minilm_dir):
    link = tmp_path / "out.jsonl"
    link.symlink_to("real.jsonl")
    proc = petal(["embed", "one text", "--output", str(link)], tmp_path)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-2000:]
    assert link.is_symlink() and json.loads((tmp_path / "real.jsonl").read_text())["index"] == 0
    assert leftovers(tmp_path) == []


def _read_only_mount_script(mount: Path, args: list[str]) -> str:
    """A shell line for a user and mount namespace: a tmpfs on ``mount`` holding ``out.npy`` (OLD), remounted read-only,
    then ``petal ARGS``, its exit code written to ``mount``'s sibling ``rc``."""
    import shlex

    petal_line = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "petal.cli.main", *args])
    return (f"mount -t tmpfs tmpfs {mount} && printf %s {shlex.quote(OLD.decode())} > {mount}/out.npy && "
            f"mount -o remount,ro {mount} && {{ {petal_line}; echo $? > {mount.parent}/rc; "
            f"cat {mount}/out.npy > {mount.parent}/kept; ls -a {mount} > {mount.parent}/listing; }}")


@pytest.mark.parametrize("name", ["out.npy", "new.jsonl"])
def test_an_output_on_a_read_only_file_system_is_73_before_the_model_loads(tmp_path, name):
    """Was 74 'Read-only file system' (an I/O error, as if a retry could help) after every text was embedded."""
    import shutil

    unshare = shutil.which("unshare")
    probe = unshare and subprocess.run([unshare, "--user", "--map-root-user", "--mount", "sh", "-c",
                                        "d=$(mktemp -d) && mount -t tmpfs tmpfs $d"], capture_output=True, timeout=60)
    if not probe or probe.returncode != 0:
        pytest.skip("cannot mount a tmpfs in a user namespace here")
    mount = tmp_path / "ro"
    mount.mkdir()
    target = mount / name
    script = _read_only_mount_script(mount, ["embed", "one text", "--model", str(tmp_path / "no-model-here"),
                                             "--output", str(target)])
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([unshare, "--user", "--map-root-user", "--mount", "sh", "-c", script], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert (tmp_path / "rc").read_text().strip() == "73", proc.stderr[-2000:]  # was 78 (the model), then 74
    assert f"cannot create --output {target}: its file system is read-only" in proc.stderr
    assert (tmp_path / "kept").read_bytes() == OLD
    assert (tmp_path / "listing").read_text().split() == [".", "..", "out.npy"]
