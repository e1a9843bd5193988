"""``petal rebuild OUT``: a new index from the embedding store with other index settings.

No model and no input shards are read: the live version's manifest names the store entry of
every shard, and those committed vectors are the whole input. The result is published as a new
version like any index run (staging directory, checksums, one atomic pointer swap).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from petal.pipeline.config import IndexSettings
from petal.pipeline.index.columns_file import add_stored_columns, missing_side_files, restore_stored_columns
from petal.pipeline.index.files import IDS_FILE
from petal.pipeline.index.plan import LIVE_VECTORS, index_kind
from petal.pipeline.index.source import StoreVectors
from petal.pipeline.index.writer import BuildResult, build_version_index, version_vectors
from petal.pipeline.jobs.report import RunReport
from petal.pipeline.jobs.report_file import check_report_file, check_report_path
from petal.pipeline.jobs.settings import check_kept_factory, kept_settings
from petal.pipeline.layout import OutputDir, denied, is_denied, not_an_index
from petal.pipeline.manifest import MANIFEST_FILE, Manifest
from petal.pipeline.reliability.errors import (
    BadInputError,
    ConfigError,
    Interrupted,
    PetalError,
    inside,
    io_error,
    quote_path,
    quote_text,
    writing,
)
from petal.pipeline.reliability.notes import say
from petal.pipeline.reliability.safe_files import check_output_dir, check_regular
from petal.pipeline.reliability.signals import StopSignals
from petal.pipeline.store.columns import ColumnsNeed, columns_path
from petal.pipeline.store.embeddings import EmbeddingStore, StoreEntry, sha256_file
from petal.pipeline.store.retention import entries_used_now
from petal.pipeline.store.side_files import remove_temp_files
from petal.pipeline.store.tombstones import held_rows, settle_tombstones, tombstone_path, tombstoned

KEEP_VERSIONS = 2  # NOTE: as pipeline/jobs/index_run.py (not imported: it pulls in torch and the engine)
FINGERPRINT_RE = re.compile(r"^[0-9a-f]{16,64}$")
PYARROW_PATH = re.compile(r"local file '(.+?)'")  # pyarrow's OSError carries no filename: its message quotes it


def store_entries(out: OutputDir, manifest: Manifest) -> list[StoreEntry]:
    """The committed store entries the live version was built from, in its shard order; a damaged one
    is exit 65 naming its file (a rebuild has no sources to embed it again), one petal may not read 66."""
    store = EmbeddingStore(out.store_dir, left=out.left)  # what it cannot delete: the report's pruned.left
    entries = []
    for shard in manifest.shards:
        if not FINGERPRINT_RE.match(shard.entry):  # NOTE: a path component read from a file
            raise ConfigError(f"{quote_path(out.root)}: the manifest names store entry {quote_text(shard.entry)} for "
                              f"{quote_path(shard.path)}")
        try:
            with reading():
                entry = store.lookup(shard.abs_path, shard.entry, repair=False)
        except BadInputError as exc:  # NOTE: named the entry and its file only: not whose it is, nor what to do
            raise BadInputError(f"{exc}: it holds the embeddings of {quote_path(shard.path)}; nothing was published: "
                                "run petal index on the sources to embed it again") from exc
        if entry is None:
            raise ConfigError(f"{quote_path(out.store_dir)} has no committed embeddings for {quote_path(shard.path)} "
                              f"(entry {shard.entry}); run petal index on the sources to embed it again")
        check_tombstone(entry, shard.deleted, shard.path)
        entries.append(entry)
    return entries


def check_tombstone(entry: StoreEntry, deleted: int, source: str) -> None:
    """The entry's ``--delete`` tombstone holds at least the ``deleted`` rows the live version left out of ``source``:
    else 65 naming it (a rebuild publishes the live version's documents, never some it deleted); one that is no
    tombstone (garbage, cut short): 65 naming it, an OS error 74 (``held_rows``). NOTE: a tombstone removed (or a
    directory in its place) was read as none, and the rebuild published the deleted documents again without a word;
    a garbled one was 78 'FAISS cannot build index' from the build's read of it."""
    with reading():
        # NOTE: not petal index's "remove it to index those rows again": a rebuild over a removed tombstone refuses
        # (below), so that advice led to a second 65; petal index is the run that indexes those rows again
        held = len(held_rows(entry.path, "remove it and run petal index on the sources to index those rows again"))
    if held < deleted and held == 0 and tombstone_path(entry.path).is_file():
        # NOTE: an empty tombstone is a deletion a later run ended (the shard changed or left the index, then came
        # back to this content), not a lost one: 'restore it' named nothing the user could restore
        raise BadInputError(f"{quote_path(source)}: a run after the live version ended its --delete of {deleted} "
                            "rows (the shard's content changed or it left the index), so the store no longer says "
                            "which rows; a rebuild would index those documents again: run petal index on the sources "
                            "(with --delete IDS to delete them again)")
    if held < deleted:
        raise BadInputError(f"{quote_path(tombstone_path(entry.path))} (a --delete tombstone) holds {held} deleted "
                            f"rows of {quote_path(source)}, the live version {deleted}: a rebuild would index the "
                            "documents it lost again; restore it, or run petal index on the sources to index them "
                            "again")


def run_rebuild(out_path: Path, settings: IndexSettings, report: RunReport, wait: bool = False,
                stop: StopSignals | None = None, given: frozenset[str] | None = None,
                json_report: Path | None = None, keep_versions: int = KEEP_VERSIONS) -> RunReport:
    """Rebuild the live version of ``out_path`` with ``settings`` and publish it.

    ``given``: the ``IndexSettings`` fields the caller chose (``None``: all of them); every other one keeps the live
    version's (``kept_settings``): a rebuild without ``--index-factory`` builds the factory the user asked for.

    ``keep_versions``: the versions left after the publish, the live one and ``keep_versions - 1`` before it (as
    ``petal index --keep-versions``; NOTE: was always 2, so a rebuild removed the rollback versions an index run had
    kept with a larger ``--keep-versions``).

    ``json_report``: where the caller writes the report (a file of the output directory: ``UsageError``, before
    any work). ``wait`` queues behind another writer (else exit 75); ``stop`` (the caller's active ``StopSignals``)
    ends the run between phases and ends a wait for the lock; a failure at any point (disk full: 74)
    removes the staging directory and leaves the live version as it was. Under the lock, the staged
    tombstones a ``--delete`` run killed around its publish left are settled first, as ``petal index``
    does (committed if the live version was built with them, else removed).
    """
    report.out = str(out_path)  # NOTE: before any check: the report is never written over a file of OUT
    if stop is not None:
        stop.check()  # a signal that arrived while petal started (its imports) stops the run before any check
    check_report_path(json_report, out_path)  # 2: --json-report OUT/CURRENT would break the index it rebuilds
    check_output_dir("OUT", out_path, create=False)  # 73 before any work: one petal cannot read or write
    check_report_file(json_report, out_path)  # 73: a report that cannot be written, said before any work
    out = OutputDir(out_path, report.pruned["left"])
    # NOTE: a plain file (a FIFO, a shard) was 'cannot read FILE/CURRENT: Not a directory', a missing or empty
    # directory 'has no published index to rebuild', where query, info and verify say the same thing one way
    if not out_path.is_dir() or out.current_version() is None:
        if (out_path / MANIFEST_FILE).is_file():
            raise ConfigError(f"{quote_path(out_path)} is a version directory; petal rebuild takes the output "
                              "directory that holds it (the one with CURRENT), and publishes a new version there")
        raise not_an_index(out_path)
    # NOTE: as petal index: store/, versions/ and the store's key trees are real directories of OUT (73 naming a
    # link); a store linked elsewhere was read (and its embeddings published) from outside OUT
    out.check_tree()
    report.out = str(out.root)
    active = stop if stop is not None else StopSignals.for_caller()
    with contextlib.nullcontext(active) if stop is not None else active, \
            out.lock(wait=wait, on_wait=say, check=active.check):
        started_from = out.started_from()  # NOTE: what the publish swaps CURRENT from (changed by hand since: 75)
        report.pruned["versions"] = out.removed_versions(out.clean_orphans())
        settle_tombstones(out, say)  # as petal index: what a --delete run killed around its publish left
        # NOTE: a killed run's leftovers (half-written entries in store/tmp, side files' temp files) stayed until the
        # next petal index (README: the next run removes them); no store entry is deleted here
        EmbeddingStore(out.store_dir, left=report.pruned["left"]).remove_leftovers()
        remove_temp_files(out.store_dir, report.pruned["left"])
        previous = out.current_manifest()
        if previous is None:
            raise ConfigError(f"{quote_path(out_path)} has no published index to rebuild; build one with petal index")
        entries = store_entries(out, previous)
        report.shards["total"] = report.shards["reused"] = len(entries)
        tally_store_rows(entries, report)
        transform = previous.output
        kind = index_kind(transform.quantize, transform.output_dtype) if transform is not None else "float32"
        settings = kept_settings(previous, settings, given)
        source = live_vectors(out, previous, entries, settings)
        deleted = tuple(tombstoned(e) for e in entries)  # NOTE: the rows ``source`` leaves out, now (see ``rebuilt``)
        # exit 2 for a factory given, 78 for the live version's kept (before any work), against the vectors the
        # index will hold. NOTE: was report.rows["reused"], every row embedded, the ones --delete removed and those
        # a later shard's same id supersedes included: a factory they could not train passed, then failed the
        # build's own check as 78 'FAISS cannot build index ... from 300 vectors ... at most 250'
        check_kept_factory(settings, kind, previous.dim, source.total or None, given,
                           out.version_dir(previous.version) / MANIFEST_FILE, LIVE_VECTORS, previous.index.settings,
                           kept_output=True)
        active.check()
        with writing(out.versions_dir):
            staging = out.staging_dir()
        try:
            with writing(staging), reading(written=staging):  # NOTE: reads the store and the live version
                result, version = _build(out, previous, source, settings, staging, deleted)
            active.check()  # NOTE: the last stop: once the pointer swaps, the rebuild is done
            out.publish(staging, version, keep_versions, started_from)
            EmbeddingStore(out.store_dir).end_full_run()  # NOTE: published: a stopped --full run is not resumed
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # a full disk gets its space back at once
            raise
        report.version = version
        try:
            if not active.requested:  # a stop signal once the version is live: pruning is left to the next run
                # NOTE: recorded before versions go: the next petal index deletes the entries only they used
                entries_used_now(out, EmbeddingStore(out.store_dir))
                report.pruned["versions"] += out.prune_versions(keep_versions, report.pruned.setdefault("in_use", []),
                                                               lambda: active.requested, published=version,
                                                               since=started_from.version)
        except OSError as exc:  # published: what is left is removed by the next run
            say(f"warning: pruning old versions of {quote_path(out.root)} failed ({exc.strerror or exc})")
    # as petal index's
    report.index = {**result.report(settings), "deleted": sum(deleted)}
    warning = result.recall_warning()
    if warning is not None:
        say(warning)
    if (out.version_dir(version) / "rejects.parquet").is_file():
        report.rejects_file = str(out.version_dir(version) / "rejects.parquet")
    report.timings_s["index"] = round(result.seconds, 3)
    if active.signum is not None:  # NOTE: past the last stop: the version is live, the exit code is the signal's
        raise Interrupted(active.signum, live_version=version)
    report.finish("success", 0, f"{result.num_vectors} vectors in {result.factory} ({result.storage}), "
                                f"version {version}{deleted_earlier(previous, deleted)}")
    return report


def deleted_earlier(previous: Manifest, deleted: tuple[int, ...]) -> str:
    """What the summary adds when the rebuild leaves out rows the live version counts as indexed: ``CURRENT`` set
    back by hand past a ``--delete`` run, whose tombstones hold for every later run (said as ``petal index`` says
    it). NOTE: said nowhere before: the rebuilt version lost those documents without a word."""
    earlier = sum(max(0, num - shard.deleted) for shard, num in zip(previous.shards, deleted))
    return f"; {earlier} deleted earlier (by the --delete of an earlier run)" if earlier else ""


def tally_store_rows(entries: list[StoreEntry], report: RunReport) -> None:
    """The rows of the version's shards, counted as a ``petal index`` run that reused every shard counts them:
    ``total`` the shards' rows, ``reused`` the rows embedded (from the store; a rebuild embeds none), ``skipped``
    by reason and ``truncated`` as the store recorded them."""
    report.rows["total"] = sum(e.num_rows for e in entries)
    report.rows["reused"] = sum(e.num_embedded for e in entries)
    report.rows["truncated"] = sum(e.num_truncated for e in entries)
    report.rows["skipped"] = {}
    for entry in entries:
        for reason, count in entry.skipped.items():
            report.skip(reason, int(count))


@contextlib.contextmanager
def reading(written: Path | None = None) -> Iterator[None]:
    """Around a rebuild's reads of its input (the store entries, the live version's files): permission denied on
    a file or a directory on the way to it is no input, 66 naming it (``layout.denied``): not a damaged entry
    (65: nothing is wrong with it), an output petal may not write (73) or an I/O error (74).

    ``written``: a directory written meanwhile (the staging directory): its errors are left to ``writing``, as are
    those that name no path.
    """
    try:
        yield
    except (OSError, PetalError) as exc:
        cause = next((e for e in _chain(exc) if is_denied(e)), None)
        if cause is None:
            raise
        path = _denied_path(cause)
        if path is None or (written is not None and inside(path, written)):
            raise
        raise denied(_blocked(path)) from exc


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the errors it was raised from (a damaged store entry wraps the ``OSError`` it met)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__


def _denied_path(exc: BaseException) -> Path | None:
    """The path an ``OSError`` names: its ``filename``, else the one pyarrow's message quotes."""
    filename = getattr(exc, "filename", None)
    if filename:
        return Path(os.fsdecode(filename))
    found = PYARROW_PATH.search(str(exc))
    return Path(found.group(1)) if found else None


def _blocked(path: Path) -> Path:
    """What denies ``path``: the first directory on the way to it that petal may not enter, else ``path``."""
    for parent in reversed(path.parents):
        if os.path.isdir(parent) and not os.access(parent, os.X_OK):
            return parent
    return path


def live_vectors(out: OutputDir, previous: Manifest, entries: list[StoreEntry],
                 settings: IndexSettings) -> StoreVectors:
    """The vectors the rebuilt index will hold (``StoreVectors``: the entries' rows less those ``--delete`` removed and
    those a later shard's same id supersedes), read as the build reads them (its errors: ``build_version_index``'s;
    a file petal may not read 66, another OS error 74 naming it)."""
    try:
        with reading():
            return version_vectors(entries, previous.dim, settings, {s.abs_path: s.path for s in previous.shards})
    except OSError as exc:
        raise io_error(exc, [out.root]) from exc


def _build(out: OutputDir, previous: Manifest, source: StoreVectors, settings: IndexSettings,
           staging: Path, deleted: tuple[int, ...]) -> tuple[BuildResult, str]:
    """Build into ``staging`` (published by the caller); a FAISS error is a ``ConfigError`` (78) naming the factory.
    ``deleted``: each shard's rows the tombstones leave out, which the manifest records."""
    entries = source.entries
    # the index type follows the output format (int8 learns its calibration again)
    result = build_version_index(entries, previous.dim, settings, staging, previous.output,
                                 shard_paths={shard.abs_path: shard.path for shard in previous.shards}, source=source)
    rejects = out.version_dir(previous.version) / "rejects.parquet"
    try:
        check_regular(rejects, out.root)  # NOTE: never a FIFO (copying it would block), never a link out
        shutil.copyfile(rejects, staging / rejects.name)
    except FileNotFoundError:
        pass
    if previous.stored is not None:  # stored text and kept columns, from the entries' side files
        need = ColumnsNeed(previous.columns.text_column if previous.stored.text else None, previous.stored.keep)
        missing = missing_side_files(entries, need)
        # NOTE: a side file gone from the store (removed by hand, a restore without it) or without a footer must not
        # drop the version's text or kept columns: the previous version holds the same rows, in the same order
        gone = (f"{len(missing)} store entries have no readable stored-columns file (gone or damaged; first: "
                f"{quote_path(columns_path(missing[0].path))})") if missing else ""
        try:
            restored = bool(missing) and restore_stored_columns(out.version_dir(previous.version) / IDS_FILE,
                                                                 staging, need.names)
        except BadInputError as exc:  # NOTE: said with the side file it stands in for, not only its own name
            raise BadInputError(f"{gone}, and the copy of the previous version is unusable: {exc}") from exc
        if restored:
            say(f"{gone}; their {', '.join(need.names)} were copied from version {previous.version}")
            result.files[IDS_FILE] = sha256_file(staging / IDS_FILE)
        elif missing:
            raise BadInputError(f"{gone}, so the rebuilt version would lose their {', '.join(need.names)}; run "
                                "petal index --full on the sources to write them again")
        elif add_stored_columns(entries, previous.dim, need, staging):
            result.files[IDS_FILE] = sha256_file(staging / IDS_FILE)
    version = out.new_version_id()
    # with the calibration this build learned (int8)
    previous.rebuilt(version, result.record(settings), result.output, deleted).write(staging / MANIFEST_FILE)
    return result, version
