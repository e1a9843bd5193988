"""A directory of OUT mounted read-only (``OUT/versions``, ``OUT/store``, ``OUT/store/shards``: EROFS) was refused 73
as "petal may not write OUT/versions (permission denied); run as a user who may read and write it, or fix its
permissions", a cause no permission fixes (OUT itself read-only said "Read-only file system"). Now each names the
read-only file system and the fix (remount it, or another --out); exit 73 as before.

The real CLI in a child process, in a private mount namespace (``unshare -m``) with a read-only bind mount; skipped
where this host does not permit one (the probe)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PETAL = str(Path(sys.executable).parent / "petal")
SAMPLE = str(Path(__file__).resolve().parent.parent / "sample_data")


def _read_only(path: Path) -> str:
    return f"mount --bind {path} {path} && mount -o remount,ro,bind {path}"


@pytest.fixture(scope="module")
def read_only_mounts(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skips unless this process may make a read-only bind mount in a private mount namespace."""
    probe = tmp_path_factory.mktemp("probe")
    if shutil.which("unshare") is None:
        pytest.skip("no unshare on this host")
    done = subprocess.run(["unshare", "-m", "sh", "-c", f"{_read_only(probe)} && ! touch {probe}/f 2>/dev/null"],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"no read-only bind mount in a private mount namespace here: {done.stderr.strip()[:200]}")


@pytest.mark.parametrize("sub", ["versions", "store", "store/shards"])
def test_a_read_only_directory_of_out_is_named_as_read_only(tmp_path, read_only_mounts, minilm_dir, sub):
    out = tmp_path / "out"
    for d in ("versions", "store/shards"):
        (out / d).mkdir(parents=True)
    done = subprocess.run(["unshare", "-m", "sh", "-c", f'{_read_only(out / sub)} && exec "$@"', "sh",
                           PETAL, "index", SAMPLE, "--out", str(out), "-q", "--device", "cpu"],
                          capture_output=True, text=True, timeout=300)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 73, done.stderr
    assert f"petal may not write {out / sub} (Read-only file system); remount it read-write, or give another " \
           "--out" in last, done.stderr
    assert "permission" not in last and "Traceback" not in done.stderr
