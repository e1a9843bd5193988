"""``petal versions OUT`` and ``petal rollback OUT [VERSION]``: the versions on disk, and making one of them live.

```
versions: OUT/versions/* -> each manifest read (id recorded?) -> newest first, the live one (CURRENT) marked
rollback: lock (75 while a run writes) -> VERSION (default: the newest whole one older than the live one)
          -> the checks opening it makes (78 naming it, with the whole versions there) -> CURRENT swapped
             (OutputDir.set_live: the publish's os.replace)
```

A rollback is the hand edit ``echo vOLD > OUT/CURRENT`` done safely: the pointer is never seen empty or cut, never
names a damaged version, and never changes under a run. What follows it is the hand edit's: the next run starts from
the version made live, and a newer version stays on disk (rolling forward to it again works) until a run publishes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from petal.pipeline.layout import (
    MAX_LISTED_VERSIONS,
    OutputDir,
    check_version_name,
    current_pointer,
    denied,
    is_denied,
    not_an_index,
    read_manifest,
)
from petal.pipeline.manifest import MANIFEST_FILE
from petal.pipeline.reliability.errors import (
    BadInputError,
    ConfigError,
    PetalError,
    one_line,
    quote_path,
)
from petal.pipeline.reliability.notes import say
from petal.pipeline.reliability.safe_files import check_output_dir


@dataclass(frozen=True)
class VersionEntry:
    """One directory of ``OUT/versions`` named as a version id (``petal.versions`` lists them, newest first)."""

    version: str
    live: bool  # CURRENT names it
    created_at: str | None  # from its manifest (None: the manifest does not read)
    num_vectors: int | None
    factory: str | None  # the FAISS factory built
    problem: str | None  # why it is no whole version (manifest unreadable, or it records another id); None: whole

    def as_dict(self) -> dict[str, Any]:
        """``petal versions --json``'s object: the fields, ``ok`` (``problem is None``), ``problem`` when set."""
        return {"version": self.version, "live": self.live, "created_at": self.created_at,
                "num_vectors": self.num_vectors, "factory": self.factory, "ok": self.problem is None,
                **({"problem": self.problem} if self.problem is not None else {})}


@dataclass(frozen=True)
class Rollback:
    """What ``rollback`` (``petal.rollback``) did: ``previous`` (what CURRENT held: a version id, or its text when it
    named none) -> ``version``; ``changed`` False when ``version`` was live already."""

    out: Path
    previous: str | None
    version: str
    changed: bool


def list_versions(out_path: Path) -> tuple[list[VersionEntry], str | None]:
    """The versions under ``out_path/versions``, newest first, and why CURRENT names none of them (``None``: it
    names a version, or there is no CURRENT). Only manifests are read (``petal rollback`` checks a version's files
    too). OUT missing or holding no versions: 78 (``not_an_index``); one petal may not read: 66."""
    out = _output_dir(out_path)
    try:
        live, pointer_problem = out.current_version(), None
    except PetalError as exc:  # NOTE: a damaged pointer is when the list is most needed: said, not fatal
        live, pointer_problem = None, one_line(str(exc))
    # NOTE: _output_dir listed versions/ (denied: 66) before
    return [_entry(out, name, name == live) for name in reversed(out.versions())], pointer_problem


def rollback(out_path: Path, version: str | None = None, wait: bool = False,
             check: Callable[[], None] | None = None) -> Rollback:
    """Make ``version`` (default: the newest whole version older than the live one) OUT's live version, under the
    writer lock (taken: 75, or with ``wait`` queue; ``check`` runs while waiting and raises to give up). The version
    must pass the checks opening it makes (``OutputDir.check_opens``), else 78 naming it and the whole versions
    there; ``CURRENT`` is swapped as a publish swaps it (``OutputDir.set_live``). Older or newer than the live one
    alike (a roll forward)."""
    check_output_dir("OUT", out_path, create=False)  # 73 before anything: an OUT petal cannot read or write
    out = _output_dir(out_path)
    with out.lock(wait=wait, on_wait=say, check=check):
        started = out.started_from()  # NOTE: what CURRENT holds under the lock; a hand edit since: 75, unchanged
        try:
            live: str | None = out.current_version()
        except PetalError:
            if version is None:  # NOTE: no live version to go back from: its message names the complete ones
                raise
            live = None
        previous = live or started.pointer
        target = version if version is not None else _previous_whole(out, live)
        try:
            out.check_opens(target)
        except (BadInputError, ConfigError) as exc:
            raise ConfigError(f"{target} is no whole version of {quote_path(out.root)}: {_why(out, target, exc)}; "
                                f"{_available(out, target)}") from exc
        if target == live:
            return Rollback(out.root, previous, target, changed=False)
        out.set_live(target, started)
    return Rollback(out.root, previous, target, changed=True)


def _output_dir(out_path: Path) -> OutputDir:
    """``out_path`` as an ``OutputDir`` that has a ``versions/`` to read; else 66 (may not read it) or 78."""
    out = OutputDir(out_path)
    for place in (out.root, out.versions_dir):
        try:
            os.listdir(place)
        except OSError as exc:
            if is_denied(exc):
                raise denied(place) from exc
    if (out.root / MANIFEST_FILE).is_file():
        raise ConfigError(f"{quote_path(out.root)} is a version directory; give the output directory that holds it "
                          "(the one with CURRENT and versions/)")
    if not out.versions_dir.is_dir():
        raise not_an_index(out.root)
    return out


def _entry(out: OutputDir, version: str, live: bool) -> VersionEntry:
    try:
        version_dir = out.version_dir(version)
        manifest = read_manifest(version_dir / MANIFEST_FILE, out.root)
    except (PetalError, OSError) as exc:
        return VersionEntry(version, live, None, None, None, one_line(str(exc)))
    try:
        check_version_name(version_dir, manifest)
        problem = None
    except PetalError as exc:
        problem = one_line(str(exc))
    return VersionEntry(version, live, manifest.created_at, manifest.index.num_vectors, manifest.index.factory,
                        problem)


def _previous_whole(out: OutputDir, live: str | None) -> str:
    """The newest version older than ``live`` that opens; 78 when there is none."""
    for candidate in reversed(out.versions()):
        if live is not None and candidate < live and out.opens(candidate):
            return candidate
    raise ConfigError(f"{quote_path(out.root)} has no whole version older than the live one ({live}) to roll back "
                        f"to; {_available(out, None)}")


def _why(out: OutputDir, version: str, exc: PetalError) -> str:
    if not os.path.lexists(out.versions_dir / version):
        return f"it is not in {quote_path(out.versions_dir)} (pruned, or never made)"
    return one_line(str(exc))


def _available(out: OutputDir, target: str | None) -> str:
    """The whole versions there, newest first (at most ``MAX_LISTED_VERSIONS``), the live one marked."""
    live = current_pointer(out.root)
    whole: list[str] = []
    for version in reversed(out.versions()):
        if len(whole) == MAX_LISTED_VERSIONS:
            break
        if version != target and out.opens(version):
            whole.append(f"{version} (live)" if version == live else version)
    if not whole:
        return "no version there passes the checks opening makes (petal versions OUT lists them)"
    return f"whole versions, newest first: {', '.join(whole)} (petal versions OUT lists them all)"

