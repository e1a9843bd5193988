"""``petal`` runs forked from tests/forkrun.py's preloaded forkserver that a file's mode can deny, and that may read
stdin: what ``setpriv --bounding-set -dac_override,-dac_read_search python -m ...`` gave the permission tests, without
a fresh interpreter importing torch, faiss and pyarrow for each run.

For root, the child drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its bounding set (so the processes it execs,
such as ``--workers``, have them no more, as under setpriv) and from its effective, permitted and inheritable sets
(capset: the forked child is one thread), and checks that they are gone before it runs petal. Still a real process:
its own pid, exit status, stdout and stderr.
"""

from __future__ import annotations

import ctypes
import os
import sys
import tempfile
from pathlib import Path

from tests import forkrun

CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2
PR_CAPBSET_DROP = 24
_CAP_V3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_file_capabilities() -> None:
    """For root: this process (one thread) and what it execs lose the capabilities that bypass file modes."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap})")
    header, data = _Header(_CAP_V3, 0), (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    keep = ~((1 << CAP_DAC_OVERRIDE) | (1 << CAP_DAC_READ_SEARCH)) & 0xFFFFFFFF
    data[0].effective &= keep
    data[0].permitted &= keep
    data[0].inheritable &= keep
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    check = (_Data * 2)()
    libc.capget(ctypes.byref(_Header(_CAP_V3, 0)), check)
    if check[0].effective & ~keep or check[0].permitted & ~keep:
        raise RuntimeError("the file capabilities are still held")


def _child(argv: list[str], env: dict[str, str | None], out: str, err: str, stdin: str | None,
           unprivileged: bool) -> None:
    if unprivileged:
        drop_file_capabilities()
    if stdin is not None:  # multiprocessing gave the child /dev/null for stdin
        fd = os.open(stdin, os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's stdin, for its life)
    forkrun._child(argv, env, out, err)


class Child(forkrun.Child):
    """A running ``petal`` process, without the file capabilities when ``unprivileged``, ``stdin`` on its stdin."""

    def __init__(self, argv: list[str], env: dict[str, str | None], stdin: bytes | None = None,
                 unprivileged: bool = True) -> None:
        self._out = tempfile.mkstemp(prefix="petal-out-")[1]
        self._err = tempfile.mkstemp(prefix="petal-err-")[1]
        self._in = None
        if stdin is not None:
            fd, self._in = tempfile.mkstemp(prefix="petal-in-")
            os.write(fd, stdin)
            os.close(fd)
        self.report_path = forkrun._report_path(argv)
        if self.report_path is not None:
            self.report_path.unlink(missing_ok=True)
        # NOTE: a daemonic process may not start children: a run with --workers is not one (as tests/_scale_shared.py)
        self.process = forkrun._context().Process(
            target=_child, args=(argv, env, self._out, self._err, self._in, unprivileged),
            daemon="--workers" not in argv)
        self.process.start()

    def wait(self, timeout: float = 120) -> forkrun.Result:
        try:
            return super().wait(timeout)
        finally:
            if self._in is not None:
                Path(self._in).unlink(missing_ok=True)


def petal(argv: list[str], env: dict[str, str | None] | None = None, stdin: bytes | None = None,
          unprivileged: bool = True, timeout: float = 300) -> forkrun.Result:
    """``petal ARGV`` (``tests.fake_cli``: the fake engine when env sets PETAL_TEST_FAKE_ENGINE) to its end."""
    return Child([str(a) for a in argv], dict(env or {}), stdin, unprivileged).wait(timeout)
