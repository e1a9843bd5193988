"""Deleting what a clean-up deletes (superseded versions, store entries no version uses, what stopped runs left)
without hiding a failure: what cannot be removed is said on stderr, naming it and why, is listed in the run report
(``pruned.left``: path and reason), and stays on disk for the next run, which tries again (and says so again while it
fails).

NOTE: ``shutil.rmtree(..., ignore_errors=True)`` left a version petal could not delete on disk as
``versions/.deleting-*`` for good, without a word, while the report listed it as pruned.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from petal.pipeline.reliability.errors import quote_path
from petal.pipeline.reliability.notes import say


def remove_tree(path: Path) -> str | None:
    """Delete ``path``: a directory with everything under it, a file or a symbolic link itself (never what it leads
    to). ``None`` once it is gone (or was not there), else why not: the first failure, naming the path it happened on
    (``OUT/versions/.deleting-V/index.faiss: Permission denied``)."""
    failures: list[str] = []

    def failed(where: str, exc: BaseException) -> None:
        failures.append(f"{quote_path(where)}: {getattr(exc, 'strerror', None) or exc}")

    try:
        if os.path.isdir(path) and not os.path.islink(path):
            if sys.version_info >= (3, 12):
                shutil.rmtree(path, onexc=lambda _f, where, exc: failed(where, exc))
            else:
                shutil.rmtree(path, onerror=lambda _f, where, info: failed(where, info[1]))
        else:
            os.unlink(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        failed(str(path), exc)
    if not os.path.lexists(path):
        return None
    return failures[0] if failures else f"{quote_path(path)}: still there"


def remove_or_leave(path: Path, what: str, left: list[dict[str, str]]) -> bool:
    """Remove ``path`` (``remove_tree``); True once it is gone. Else ``leave`` it: said, and appended to ``left``."""
    reason = remove_tree(path)
    if reason is None:
        return True
    leave(path, what, reason, left)
    return False


def leave(path: Path, what: str, reason: str, left: list[dict[str, str]]) -> None:
    """``path`` (``what`` it is) stays on disk for ``reason``: a warning on stderr names all three, and ``left`` (a run
    report's ``pruned.left``) gets its path and reason."""
    say(f"warning: could not remove {quote_path(path)} ({what}; {reason}): it stays on disk, and the next run tries "
        "again; fix its permissions, or remove it by hand")
    left.append({"path": str(path), "reason": reason})
