"""``petal rebuild OUT``: a new index from the embedding store with other index settings.

No model and no input shards are read: the live version's manifest names the store entry of
every shard, and those committed vectors are the whole input. The result is published as a new
version like any index run (staging directory, checksums, one atomic pointer swap).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from petal.pipeline.config import IndexSettings
from petal.pipeline.index.columns_file import add_stored_columns
from petal.pipeline.index.files import IDS_FILE
from petal.pipeline.index.plan import check_index_factory, index_kind
from petal.pipeline.index.writer import BuildResult, build_version_index
from petal.pipeline.jobs.report import RunReport
from petal.pipeline.layout import OutputDir
from petal.pipeline.manifest import MANIFEST_FILE, Manifest
from petal.pipeline.reliability.errors import ConfigError
from petal.pipeline.store.columns import ColumnsNeed
from petal.pipeline.store.embeddings import EmbeddingStore, StoreEntry, sha256_file

KEEP_VERSIONS = 2  # NOTE: as pipeline/jobs/index_run.py (not imported: it pulls in torch and the engine)
FINGERPRINT_RE = re.compile(r"^[0-9a-f]{16,64}$")


def store_entries(out: OutputDir, manifest: Manifest) -> list[StoreEntry]:
    """The committed store entries the live version was built from, in its shard order."""
    store = EmbeddingStore(out.store_dir)
    entries = []
    for shard in manifest.shards:
        if not FINGERPRINT_RE.match(shard.entry):  # NOTE: a path component read from a file
            raise ConfigError(f"{out.root}: the manifest names store entry {shard.entry!r} for {shard.path}")
        entry = store.lookup(shard.abs_path, shard.entry)
        if entry is None:
            raise ConfigError(f"{out.store_dir} has no committed embeddings for {shard.path} (entry "
                              f"{shard.entry}); run petal index on the sources to embed it again")
        entries.append(entry)
    return entries


def run_rebuild(out_path: Path, settings: IndexSettings, report: RunReport) -> RunReport:
    """Rebuild the live version of ``out_path`` with ``settings`` and publish it."""
    out = OutputDir(out_path)
    if out.current_version() is None:
        raise ConfigError(f"{out_path} has no published index to rebuild; build one with petal index")
    report.out = str(out.root)
    with out.lock():
        out.clean_orphans()
        previous = out.current_manifest()
        assert previous is not None
        entries = store_entries(out, previous)
        report.shards["total"] = report.shards["reused"] = len(entries)
        report.rows["embedded"] = sum(e.num_embedded for e in entries)
        transform = previous.output
        kind = index_kind(transform.quantize, transform.output_dtype) if transform is not None else "float32"
        check_index_factory(settings, kind, previous.dim, report.rows["embedded"])  # exit 2, before any work
        staging = out.staging_dir()
        try:
            result, version = _build(out, previous, entries, settings, staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # gone by now if the rename happened
            raise
        out.prune_versions(KEEP_VERSIONS)
    report.version = version
    report.index = result.report()
    report.timings_s["index"] = round(result.seconds, 3)
    report.finish("success", 0, f"{result.num_vectors} vectors in {result.factory} ({result.storage}), "
                                f"version {version}")
    return report


def _build(out: OutputDir, previous: Manifest, entries: list[StoreEntry], settings: IndexSettings,
           staging: Path) -> tuple[BuildResult, str]:
    """Build into ``staging`` and publish; a FAISS error is a ``ConfigError`` (78) naming the factory."""
    # the index type follows the output format (int8 learns its calibration again)
    result = build_version_index(entries, previous.dim, settings, staging, previous.output)
    rejects = out.version_dir(previous.version) / "rejects.parquet"
    if rejects.is_file():
        shutil.copy2(rejects, staging / rejects.name)
    if previous.stored is not None:  # stored text and kept columns, from the entries' side files
        need = ColumnsNeed(previous.columns.text_column if previous.stored.text else None, previous.stored.keep)
        if add_stored_columns(entries, previous.dim, need, staging):
            result.files[IDS_FILE] = sha256_file(staging / IDS_FILE)
    version = out.new_version_id()
    # with the calibration this build learned (int8)
    previous.rebuilt(version, result.record(settings), result.output).write(staging / MANIFEST_FILE)
    out.publish(staging, version)
    return result, version
