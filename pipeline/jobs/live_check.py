"""Is the live version whole? Checked by every ``petal index`` run that would otherwise publish nothing.

A live version whose files are missing, swapped for a FIFO or a symlink, or no longer match the
manifest's sha256 (every byte checked, as ``petal verify`` does: a garbage ``index.faiss``, a deleted
``ids.parquet``) would fail every query while reruns report ``nothing-to-do``; the run rebuilds it
from the store instead.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.index.files import IDS_FILE
from petal.pipeline.index.search import verify_files
from petal.pipeline.index.verify import verify_version
from petal.pipeline.layout import OutputDir
from petal.pipeline.manifest import Manifest
from petal.pipeline.reliability.errors import Interrupted, PetalError, one_line, quote_path
from petal.pipeline.reliability.safe_files import check_regular


def live_damage(out: OutputDir, manifest: Manifest) -> str | None:
    """Why the live version cannot serve queries (``None`` when its files are whole)."""
    try:
        version = out.current_version()
        if version is None:
            return "no live version"
        version_dir = out.version_dir(version)
        # NOTE: the full check (every byte against its sha256, as petal verify): this runs in the writer,
        # once per run, not on every query's open (which reads only sizes and heads/tails).
        verify_files(version_dir)
        report = verify_version(version_dir)
        bad = [f"{f.name}: {f.problem}" for f in report.files if not f.ok]
        if bad:
            return one_line(f"{quote_path(version_dir)}: {'; '.join(bad)}")[:300]
        ids = version_dir / IDS_FILE
        check_regular(ids, version_dir)
        rows = pq.read_metadata(ids).num_rows
        if rows != manifest.index.num_vectors:
            return f"{quote_path(ids)} maps {rows} ids for {manifest.index.num_vectors} vectors"
    except Interrupted:  # a stop signal while reading (the check runs interruptible): the run stops, no repair
        raise
    except (PetalError, OSError, pa.ArrowException, KeyError, TypeError, ValueError, AttributeError) as exc:
        return one_line(str(exc))[:300] or type(exc).__name__
    return None
