"""The lease ``petal serve`` holds on the version it serves (``VersionLease``, pipeline/layout.py: a shared flock
on the version's manifest), so that a ``petal index``/``rebuild`` run does not prune it from under the server:
a run with ``--keep-versions 1`` whose version the server refused (another model, another output transform)
keeps the one the server still serves.

```
start:  resolve OUT's version -> lease it -> load the model (minutes) -> open the leased version
follow: open the new version -> compatible? lease it -> prepare -> swap; the old version's lease is released
        with the old version itself, after the last request that holds it (weakref.finalize)
exit:   the kernel drops every lease (SIGKILL included)
```
"""

from __future__ import annotations

import logging
import weakref
from pathlib import Path

from petal.pipeline.layout import VersionLease, resolve_index_dir
from petal.pipeline.manifest import Manifest
from petal.pipeline.reliability.errors import TemporaryFailure, quote_path

log = logging.getLogger("petal.serve")

FIRST_ATTEMPTS = 3  # a version pruned between reading CURRENT and leasing it: CURRENT names a newer one


def lease(version_dir: Path) -> VersionLease:
    """A lease on ``version_dir`` (``FileNotFoundError``: gone, or being deleted); where the filesystem has no
    locks, an unheld one and a warning (the version may be pruned while it serves, as before leases)."""
    held = VersionLease(version_dir)
    if not held.held:
        log.warning("petal serve: %s; a petal index run with --keep-versions may delete the version served", held.why)
    return held


def lease_first_version(index_path: Path) -> tuple[Path, Manifest, VersionLease]:
    """The version ``index_path`` names (OUT's CURRENT, or a version directory) and a lease on it, taken before
    the model loads: a re-index meanwhile cannot prune it. A version pruned between reading CURRENT and the lease
    is read again (CURRENT names a newer one); ``ConfigError`` as ``resolve_index_dir``."""
    for attempt in range(1, FIRST_ATTEMPTS + 1):
        version_dir, manifest = resolve_index_dir(index_path)
        try:
            return version_dir, manifest, lease(version_dir)
        except FileNotFoundError as exc:
            if attempt == FIRST_ATTEMPTS:
                raise TemporaryFailure(f"{quote_path(version_dir)} was deleted while petal serve opened it "
                                       "(re-indexing?); retry") from exc
    raise AssertionError("unreachable")


def release_with(holder: object, held: VersionLease) -> None:
    """Release ``held`` when ``holder`` (the ``SearchIndex`` served) is freed: after the swap to a newer version
    and the last request that took it."""
    weakref.finalize(holder, held.release)
