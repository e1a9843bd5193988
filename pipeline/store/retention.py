"""Which store entries a clean-up keeps: those some version on disk uses (README: petal deletes store entries no
version uses), and, for a while, the unpublished work a resumable run may still reuse.

Every version left in ``OUT/versions/`` is a way back (``echo vOLD > OUT/CURRENT``): the versions
``--keep-versions`` keeps, one a reader holds a lease on (pruning leaves it, pipeline/layout.py), one newer than
the live one that a reader still holds. Each must stay usable as the live version, so ``petal rebuild`` and an
additive ``petal index`` run need the store entries its manifest names (the shards it kept are read from them);
an entry is deleted only once no version on disk names it. Versions are pruned first, so the entries of a pruned
version go in the same clean-up.

An entry (or committed range, ``OUT/store/parts``) no version uses is deleted at once only when it is garbage:

- a version on disk used it once: before this clean-up pruned versions, or before an earlier one, a ``petal
  rebuild`` or a failed clean-up pruned them (its shard changed or was dropped since). Every clean-up and
  ``petal rebuild`` records the entries its pruning may leave unused (``OUT/store/published/<key>/<fp>``, an
  empty file, made durable): those of the versions on disk that the live version, never pruned, does not use, before
  it prunes a version (``entries_used_now``), so once the versions are gone the entry is still known as published
  work; an entry of an older petal's OUT whose versions were pruned has no record, and is
  kept as below, or
- it is superseded: the live version holds its shard from another entry committed after it (a changed shard's old
  entry), or the file it was embedded from has changed since (a revert), or (a range) its shard's entry is assembled.

Anything else is work an interrupted, refused or stopped run committed, which its rerun reuses even when another run
on the same OUT published in between (README: "rerun the same command: it embeds only what was not committed"): it
is kept for ``keep_unused_s`` after its commit (``--keep-unused``), then deleted, so the store stays bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from petal.pipeline.layout import OutputDir, read_manifest
from petal.pipeline.manifest import MANIFEST_FILE
from petal.pipeline.reliability.durable import fsync_dir
from petal.pipeline.reliability.errors import PetalError
from petal.pipeline.store.embeddings import ENTRY_MAX_BYTES, EmbeddingStore, shard_key, warn
from petal.pipeline.store.side_files import PUBLISHED_TREE, prune_side_files, side_file

ENTRY_FILE = "entry.json"  # an entry's (or committed range's) record, written last at its commit

@dataclass
class Pruned:
    """What a store clean-up did: entries and committed ranges deleted, and the unused ones kept or deleted by the
    ``--keep-unused`` window (the run report's ``pruned``)."""

    store_entries: int = 0  # entries deleted (garbage, or unused past the window)
    ranges: int = 0  # committed ranges deleted
    unused_kept: int = 0  # entries and ranges no version uses, kept for the window (a rerun reuses them)
    unused_pruned: int = 0  # entries and ranges no version used, deleted once the window was over
    stopped: bool = False  # a stop signal ended it early: the rest is left to the next run


def entries_in_use(out: OutputDir, store: EmbeddingStore) -> set[Path]:
    """The entry directories (``OUT/store/shards/<shard key>/<fingerprint>``) the shards of every version in
    ``OUT/versions/`` were built from. A manifest petal cannot read raises a ``PetalError`` naming it (78, 66):
    what that version uses is unknown."""
    return set().union(*entries_by_version(out, store).values())


def entries_by_version(out: OutputDir, store: EmbeddingStore) -> dict[str, set[Path]]:
    """``entries_in_use`` per version in ``OUT/versions/`` (each manifest read once)."""
    used: dict[str, set[Path]] = {}
    for version in out.versions():
        manifest = read_manifest(out.version_dir(version) / MANIFEST_FILE, out.root)
        used[version] = {store.shards_dir / shard_key(shard.abs_path) / shard.entry for shard in manifest.shards}
    return used


def entries_used_now(out: OutputDir, store: EmbeddingStore) -> set[Path]:
    """``entries_in_use``, read before versions are pruned (what they used becomes garbage). Those a pruning may leave
    unused (``prunable_entries``) are recorded as published (``mark_published``) before it returns; none when a
    manifest does not read (``prune_unused`` then deletes nothing). An ``OSError`` of the record stops the caller
    before it prunes a version."""
    try:
        by_version = entries_by_version(out, store)
    except PetalError:
        return set()
    mark_published(prunable_entries(out, by_version))
    return set().union(*by_version.values())


def prunable_entries(out: OutputDir, by_version: dict[str, set[Path]]) -> set[Path]:
    """The entries of ``by_version`` (``entries_by_version``) that pruning versions may leave unused: those a version
    other than the live one uses and the live one does not; all when no version on disk is live. NOTE: the live
    version is never pruned (``OutputDir.prune_versions``): its entries are recorded by the clean-up that prunes the
    last version using them, once the live version is another. Recording (and syncing) every entry of the live version
    at each clean-up synced one directory per new shard key: clean-up took 10 s at 3,000 shards (0.7 s at 1,000)."""
    try:
        live = out.current_version()
    except (PetalError, OSError):
        live = None
    if live not in by_version:
        return set().union(*by_version.values())
    others = [entries for version, entries in by_version.items() if version != live]
    return set().union(*others) - by_version[live]


def mark_published(entries: set[Path]) -> None:
    """Record each entry (present in the store) as used by a published version: ``OUT/store/published/<key>/<fp>``,
    an empty file, synced with its directory, so that a crash or an error after the versions that used it are pruned
    leaves it known as garbage (was: kept ``--keep-unused`` as an interrupted run's work)."""
    synced: set[Path] = set()
    for entry in sorted(entries):
        marker = side_file(entry, PUBLISHED_TREE)
        if was_published(entry) or not (entry / ENTRY_FILE).is_file():
            continue
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.unlink(missing_ok=True)  # NOTE: a stale record (its entry deleted, the same one committed since)
        # NOTE: O_NOFOLLOW | O_EXCL: a planted link is never followed; a marker made since is fine
        with contextlib.suppress(FileExistsError):
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
        synced.add(marker.parent)
    for directory in sorted(synced):
        fsync_dir(directory)
    if synced:
        fsync_dir(next(iter(synced)).parent)  # OUT/store/published: a new key directory is in it


def was_published(entry: Path) -> bool:
    """True when ``mark_published`` recorded the entry: a regular file (never through a link) made after the entry's
    commit. NOTE: one older than the commit is the record of an entry deleted since (a clean-up killed before it
    removed the record) whose shard a later run committed again: not published work, kept as unpublished."""
    try:
        st = os.lstat(side_file(entry, PUBLISHED_TREE))
    except OSError:
        return False
    committed = committed_ns(entry)
    return stat.S_ISREG(st.st_mode) and (committed is None or st.st_mtime_ns >= committed)


def committed_ns(path: Path) -> int | None:
    """When the entry or committed range at ``path`` was committed (its ``entry.json``, written last, is never
    modified after); ``None``: unknown (not an entry, or one petal may not stat)."""
    try:
        return (path / ENTRY_FILE).stat().st_mtime_ns
    except OSError:
        try:
            return path.lstat().st_mtime_ns
        except OSError:
            return None


def source_unchanged(path: Path) -> bool:
    """True when the local file the entry (or committed range) at ``path`` was embedded from is still that file (its
    size, mtime, inode change time and inode as recorded): a rerun would reuse it. False for an object of a bucket
    (no stat is taken), a file gone or changed, or a record petal cannot read."""
    try:
        with open(path / ENTRY_FILE, "rb") as file:
            source = json.loads(file.read(ENTRY_MAX_BYTES))["source"]
        if not str(source["abs_path"]).startswith("/"):
            return False
        st = os.stat(source["abs_path"])
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) == \
            (int(source["size"]), int(source["mtime_ns"]), int(source["ctime_ns"]), int(source["inode"]))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def prune_unused(out: OutputDir, store: EmbeddingStore, live: set[Path], was_used: set[Path],
                 keep_unused_s: float, stopping: Callable[[], bool] = lambda: False) -> Pruned:
    """Delete the store entries (and their side files: tombstones, stored columns) and committed ranges that are
    garbage (module docstring), and the unused ones older than ``keep_unused_s``. ``live``: the entries of the
    version published or live (the run's own); ``was_used``: ``entries_in_use`` before versions were pruned.
    Stops between paths once ``stopping()``.

    When what a version uses cannot be read (its manifest unreadable or damaged), no entry is deleted: said on
    stderr, and the next run tries again (a version pruned or repaired by then no longer stands in the way)."""
    pruned = Pruned()
    try:
        keep = entries_in_use(out, store) | live
    except PetalError as exc:
        warn(f"kept every store entry, as one may belong to a version on disk: {exc}")
        return pruned
    newest_live: dict[str, int] = {}  # shard key -> when the live version's entry of it was committed
    for entry in live:
        ns = committed_ns(entry)
        newest_live[entry.parent.name] = max(ns if ns is not None else 0, newest_live.get(entry.parent.name, 0))
    expired_before = time.time_ns() - int(keep_unused_s * 1e9)

    def garbage(path: Path, key: str, used_before: bool) -> bool | None:
        """True: delete now; None: unused past the window (delete); False: keep for the window."""
        ns = committed_ns(path)
        if used_before or was_published(path):
            return True
        if key in newest_live and (ns is None or ns < newest_live[key] or not source_unchanged(path)):
            return True  # the live version's entry of the shard is newer, or the file changed since (a revert)
        if ns is None or ns <= expired_before:
            return None
        return False

    for key_dir in store.listing(store.root / "parts"):  # parts/<key>/<fingerprint>/g<first>-<stop>
        for fp_dir in store.listing(key_dir):
            assembled = (store.shards_dir / key_dir.name / fp_dir.name).is_dir()
            for part in store.listing(fp_dir, dirs_only=False):
                if stopping():
                    pruned.stopped = True
                    return pruned
                verdict = True if assembled else garbage(part, key_dir.name, False)
                if verdict is False:
                    pruned.unused_kept += 1
                elif store.discard_unused(part, "a committed range no version uses"):
                    pruned.ranges += 1
                    pruned.unused_pruned += verdict is None
            store.remove_if_empty(fp_dir)
        store.remove_if_empty(key_dir)
    kept: set[Path] = set()  # NOTE: what the walk leaves; listed once (a second walk listed every key again)
    for key_dir in store.listing(store.shards_dir):  # NOTE: never through a link: its target may lie outside OUT
        listed = store.listing(key_dir, dirs_only=False)
        for entry_dir in listed:
            kept.add(entry_dir)
            if entry_dir in keep:
                continue
            if stopping():
                pruned.stopped = True
                return pruned
            verdict = garbage(entry_dir, key_dir.name, entry_dir in was_used)
            if verdict is False:
                pruned.unused_kept += 1
                continue
            if store.discard_unused(entry_dir, "a store entry no version uses"):
                kept.discard(entry_dir)
                pruned.store_entries += 1
                pruned.unused_pruned += verdict is None
        if kept.isdisjoint(listed):  # emptied by the walk (or empty, or not listed): else it holds what it kept
            store.remove_if_empty(key_dir)
    prune_side_files(store.root, kept | keep, store.left)
    return pruned


def say_unused(pruned: Pruned, keep_unused_s: float, say: Callable[[str], None]) -> None:
    """One line on stderr for the unused work a clean-up kept or deleted (``--keep-unused``)."""
    window = duration_text(keep_unused_s)
    if pruned.unused_pruned:
        say(f"note: removed {pruned.unused_pruned} store entries and committed ranges no version used, committed more "
            f"than {window} ago (--keep-unused {window})")
    if pruned.unused_kept:
        say(f"note: kept {pruned.unused_kept} store entries and committed ranges no version uses (work a rerun of an "
            f"interrupted or refused run reuses) until {window} after their commit (--keep-unused {window})")


def duration_text(seconds: float) -> str:
    """``7d``, ``12h``, ``30m``, ``45s``: as ``--keep-unused`` reads it (``parse_duration``)."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
