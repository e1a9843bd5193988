"""A server following OUT that becomes unreadable (``chmod 000 OUT`` while it serves): ``/ready``'s refusal names OUT,
as ``petal info OUT`` does. It said 'OUT/CURRENT: petal may not read it', whose mode was fine, so fixing CURRENT's
permissions (what the message asked) did nothing. The follower's reading of the pointer is run in a forked child
without the capabilities that bypass file modes (tests/_perms_shared.py), on a real index of vectors."""

from __future__ import annotations

import os

import pytest

from petal.pipeline.serve.follower import _no_pointer
from tests._open_audit_shared import copy_index, vectors_index
from tests._perms_shared import drop_file_capabilities


def unprivileged(fn, *args) -> str:
    """``fn(*args)`` (a str) in a forked child that may not bypass file modes."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read)
            drop_file_capabilities()
            os.write(write, fn(*args).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(pid, 0)
    return said


@pytest.mark.parametrize("blocked", ["OUT", "CURRENT"])
def test_an_unreadable_out_is_named_not_its_current(tmp_path_factory, tmp_path, blocked):
    built = vectors_index(tmp_path_factory.mktemp("unreadable_out"), rows=20, dim=8, seed=3)
    out, _ = copy_index(built, tmp_path)
    target = out if blocked == "OUT" else out / "CURRENT"
    mode = target.stat().st_mode
    target.chmod(0)
    try:
        said = unprivileged(_no_pointer, out)
    finally:
        target.chmod(mode)
    assert "petal may not read it (permission denied)" in said, said
    assert said.startswith(f"{target}:") or said.startswith(f"'{target}':"), said
