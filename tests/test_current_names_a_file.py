"""``CURRENT`` naming a version whose entry under ``versions/`` is a file (not a directory) is refused (78) saying
so, by ``petal query``, ``petal info`` and ``petal.open_index``: the message said the version 'is not in versions/',
which ``ls versions`` contradicts. A version that is gone is still 'not in versions/'.

Real Parquet, real FAISS; each command in its own process (tests/forkrun.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import forkrun
from tests._open_audit_shared import api, copy_index, vectors_index


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vectors_index(tmp_path_factory.mktemp("current_file"), rows=50, dim=8, seed=1)


@pytest.mark.parametrize("entry", ["a file", "gone"])
def test_current_naming_a_file_says_so(built: Path, tmp_path: Path, entry: str) -> None:
    out, version = copy_index(built, tmp_path)
    shutil.rmtree(version)
    if entry == "a file":
        version.write_text("x")
    said = "is a file, not a directory" if entry == "a file" else "which is not in"
    for done in (forkrun.petal(["query", str(out), "--vector-file", str(built.parent / "q.npy")]),
                 forkrun.petal(["info", str(out)])):
        assert done.rc == 78 and said in done.last_line and "Traceback" not in done.stderr, done.stderr
    opened = api(out)
    assert opened.returncode == 78 and said in opened.stderr, opened.stderr


@pytest.mark.parametrize("link", ["to another directory in versions/", "to itself"])
def test_a_version_that_is_a_link_inside_versions_says_so(built: Path, tmp_path: Path, link: str) -> None:
    """A version entry that is a symbolic link within versions/ is refused (78) as a link; it said it 'leads out of
    versions/', which it does not (a link out still says so)."""
    out, version = copy_index(built, tmp_path)
    if link == "to itself":
        shutil.rmtree(version)
        version.symlink_to(version.name)
    else:
        version.rename(version.parent / "real")
        version.symlink_to("real")
    for done in (forkrun.petal(["query", str(out), "--vector-file", str(built.parent / "q.npy")]),
                 forkrun.petal(["info", str(out)]), forkrun.petal(["verify", str(out)])):
        assert done.rc == 78 and "is a symbolic link, not a version directory" in done.last_line, done.stderr


@pytest.mark.parametrize("target", ["v000009-gone", "versions/v000009-gone", "gone/CURRENT"])
def test_a_current_that_links_to_nothing_says_so_not_wait_for_a_run(built: Path, tmp_path: Path, target: str) -> None:
    """CURRENT a symbolic link to nothing: refused (78) as a link to nothing, naming its target, by every command
    that reads OUT and the API; it said OUT 'holds no published version yet ... wait for it to finish', sending an
    operator to wait for a run that is not there. (A link out of OUT is refused as one.)"""
    out, _ = copy_index(built, tmp_path)
    (out / "CURRENT").unlink()
    (out / "CURRENT").symlink_to(target)
    said = f'is a symbolic link to nothing ("{target}")'
    for argv in (["query", str(out), "--vector-file", str(built.parent / "q.npy")], ["info", str(out)],
                 ["verify", str(out)]):
        done = forkrun.petal(argv)
        assert done.rc == 78 and said in done.last_line and "no published version" not in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    opened = api(out)
    assert opened.returncode == 78 and said in opened.stderr, opened.stderr
    assert (out / "CURRENT").is_symlink()  # left as it was
    # the hint's command removes the link first: 'echo V > CURRENT' wrote through it, leaving a stray file where
    # it pointed (under versions/: a damaged version to every later run) and the link in place
    import re
    import subprocess

    hint = re.search(r"by hand: (rm .+? && echo .+?); complete versions", done.last_line)
    assert hint, done.last_line
    subprocess.run(["sh", "-c", hint.group(1)], check=True, timeout=60)
    assert not (out / "CURRENT").is_symlink() and not (out / "versions" / "v000009-gone").exists()
    assert forkrun.petal(["info", str(out)]).rc == 0


def test_versions_linked_out_of_out_names_versions_not_the_version(built: Path, tmp_path: Path) -> None:
    """OUT/versions itself a symbolic link out of OUT: refused (78) naming OUT/versions as the link that leads out of
    OUT; it said 'OUT/versions/V leads out of OUT/versions', blaming the version, which lies where the link leads
    (a version entry that leads out of versions/ still says so)."""
    out, version = copy_index(built, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (out / "versions").rename(elsewhere)
    (out / "versions").symlink_to(elsewhere)
    said = f"{out / 'versions'} leads out of {out} (a symlink)"
    for argv in (["query", str(out), "--vector-file", str(built.parent / "q.npy")], ["info", str(out)],
                 ["verify", str(out)], ["verify", str(out), "--version", version.name]):
        done = forkrun.petal(argv)
        assert done.rc == 78 and said in done.last_line and f"{version.name} leads out" not in done.stderr, \
            (argv, done.stderr)
    opened = api(out)
    assert opened.returncode == 78 and said in opened.stderr, opened.stderr


def test_a_version_linked_out_of_versions_still_says_so(built: Path, tmp_path: Path) -> None:
    out, version = copy_index(built, tmp_path)
    version.rename(tmp_path / "elsewhere")
    version.symlink_to(tmp_path / "elsewhere")
    done = forkrun.petal(["info", str(out)])
    assert done.rc == 78 and f"{version} leads out of {out / 'versions'}" in done.last_line, done.stderr
