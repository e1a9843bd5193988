"""``petal info`` on a version written before head/tail records existed (petal 0.1's ``"format": 1``, the fixture of
tests/test_manifest.py): its files are not hashed (O(size), ``petal verify`` does it), but a listed file petal may not
read is still no input, exit 66 naming it, as ``petal query`` and ``petal verify`` say and the README promises for
``petal info``. Before: ``petal info`` said nothing of it and exited 0 ("not checked" only).

Real processes without the file capabilities (tests/_perms_shared.py), the real fixture's Parquet and FAISS files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests import _perms_shared as perms
from tests.conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "format1" / "out"


@pytest.mark.parametrize("name", ["ids.parquet", "index.faiss"])
def test_info_on_an_older_version_with_a_file_petal_may_not_read_is_66_naming_it(tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    shutil.copytree(FIXTURE, out)
    listed = next((out / "versions").glob("v*")) / name
    listed.chmod(0)
    try:
        text = perms.petal(["info", out])
        as_json = perms.petal(["info", out, "--json"])
        verify = perms.petal(["verify", out])
    finally:
        listed.chmod(0o644)
    assert text.rc == 66, text.stderr[-2000:]
    assert name in text.last_line and "Traceback" not in text.stderr
    assert as_json.rc == 66 and json.loads(as_json.stdout)["exit_code"] == 66
    assert verify.rc == 66, verify.stderr[-2000:]


def test_info_on_a_readable_older_version_still_notes_what_it_did_not_check(tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(FIXTURE, out)
    run = perms.petal(["info", out])
    assert run.rc == 0, run.stderr[-2000:]
    assert "written before head/tail checksums existed" in run.stderr and "not checked" in run.stderr
