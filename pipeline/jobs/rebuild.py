"""``petal rebuild OUT``: a new index from the embedding store with other index settings.

No model and no input shards are read: the live version's manifest names the store entry of
every shard, and those committed vectors are the whole input. The result is published as a new
version like any index run (staging directory, checksums, one atomic pointer swap).
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

from petal import __version__
from petal.pipeline.config import IndexSettings
from petal.pipeline.index.checksums import seal_manifest
from petal.pipeline.index.columns_file import add_stored_columns
from petal.pipeline.index.factory_fit import check_factory_fits, faiss_failure
from petal.pipeline.index.files import IDS_FILE
from petal.pipeline.index.output_index import build_output_index
from petal.pipeline.index.writer import build_index
from petal.pipeline.jobs.report import RunReport
from petal.pipeline.layout import OutputDir
from petal.pipeline.reliability.durable import write_json_atomic
from petal.pipeline.reliability.errors import FAISS_WRITE_ERRORS, ConfigError, PetalError
from petal.pipeline.store.columns import ColumnsNeed
from petal.pipeline.store.embeddings import EmbeddingStore, StoreEntry, sha256_file
from petal.pipeline.store.outputs import OutputTransform, add_output_manifest

KEEP_VERSIONS = 2  # NOTE: as pipeline/jobs/index_run.py (not imported: it pulls in torch and the engine)
FINGERPRINT_RE = re.compile(r"^[0-9a-f]{16,64}$")


def store_entries(out: OutputDir, manifest: dict) -> list[StoreEntry]:
    """The committed store entries the live version was built from, in its shard order."""
    store = EmbeddingStore(out.store_dir)
    entries = []
    for shard in manifest.get("shards", []):
        fingerprint = str(shard.get("entry", ""))
        if not FINGERPRINT_RE.match(fingerprint):  # NOTE: a path component read from a file
            raise ConfigError(f"{out.root}: the manifest names store entry {fingerprint!r} for {shard.get('path')}")
        entry = store.lookup(str(shard["abs_path"]), fingerprint)
        if entry is None:
            raise ConfigError(f"{out.store_dir} has no committed embeddings for {shard['path']} (entry "
                              f"{fingerprint}); run petal index on the sources to embed it again")
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
        if "output" not in previous or previous["output"].get("quantize", "none") == "none":
            check_factory_fits(settings, int(previous["dim"]), report.rows["embedded"])  # exit 2, before any work
        staging = out.staging_dir()
        try:
            result, version = _build(out, previous, entries, settings, staging)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # gone by now if the rename happened
            raise
        out.prune_versions(KEEP_VERSIONS)
    report.version = version
    report.index = {"factory": result.factory, "metric": result.metric, "num_vectors": result.num_vectors,
                    "storage": result.plan.get("storage", "memory"), "search_params": result.search_params,
                    "tuning": result.tuning, "device": result.device}
    report.timings_s["index"] = round(result.seconds, 3)
    report.finish("success", 0, f"{result.num_vectors} vectors in {result.factory} "
                                f"({result.plan.get('storage', 'memory')}), "
                                f"version {version}")
    return report


def _build(out: OutputDir, previous: dict, entries: list[StoreEntry], settings: IndexSettings,
           staging: Path) -> tuple[Any, str]:
    """Build into ``staging`` and publish; a FAISS error is a ``ConfigError`` (78) naming the factory."""
    transform = OutputTransform.from_record(previous["output"]) if "output" in previous else None
    dim = int(previous["dim"])
    try:
        if transform is not None:  # the index type follows the output format
            result, transform = build_output_index(entries, transform, settings, staging)
        else:
            result = build_index(entries, dim, settings, staging)
    except (RuntimeError, ValueError) as exc:
        if isinstance(exc, PetalError) or any(m in str(exc) for m in FAISS_WRITE_ERRORS):
            raise
        raise faiss_failure(exc, settings.factory, dim, sum(e.num_embedded for e in entries)) from exc
    rejects = out.version_dir(previous["version"]) / "rejects.parquet"
    if rejects.is_file():
        shutil.copy2(rejects, staging / rejects.name)
    if "columns" in previous:  # stored text and kept columns, from the entries' side files
        need = ColumnsNeed(str(previous["read"]["text_column"]), tuple(previous["columns"].get("keep", [])))
        if add_stored_columns(entries, dim, need, staging):
            result.files[IDS_FILE] = sha256_file(staging / IDS_FILE)
    version = out.new_version_id()
    manifest = {
        **previous,
        "petal_version": __version__,
        "version": version,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rebuilt_from": previous["version"],
        "metric": settings.metric,
        "index": result.manifest(settings),
        "counts": {**previous.get("counts", {}), "vectors": result.num_vectors},
    }
    if transform is not None:
        add_output_manifest(manifest, transform)  # with the calibration this build learned (int8)
    write_json_atomic(staging / "manifest.json", seal_manifest(staging, manifest))  # + head/tail checksums
    out.publish(staging, version)
    return result, version
