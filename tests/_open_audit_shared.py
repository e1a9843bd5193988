"""What the audits of opening an index share: the Python API's open and search of an index in its own process, forked
from tests/forkrun.py's preloaded forkserver (a crash, SIGBUS or SIGSEGV, ends that child, not the test run): what
``python -c`` of the same lines did, without a fresh interpreter's imports; a small index petal builds from a
Parquet shard of random vectors (``--vectors-column``); a built index copied to damage; its manifest edited and
signed again, as an editor that knows the checksum scheme would."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from petal.pipeline.index.checksums import CHECKSUM_KEY, INTEGRITY_KEY, canonical_sha256, head_tail_sha256
from tests import forkrun


def _search(out: str, where: str) -> None:
    import numpy as np

    import petal
    from petal.pipeline.reliability.errors import PetalError

    try:
        with petal.open_index(out) as index:
            index.search_stored(np.ones((2, index.dim), np.float32), k=5, where=where or None)
    except PetalError as exc:
        print(exc, file=sys.stderr)
        sys.exit(exc.exit_code)


def api(out: Path, where: str = "", timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``petal.open_index(out)`` and a search of two rows (``where`` if given) in a child process: exit 0, the
    ``PetalError``'s code with its message on stderr, 1 with a traceback, or -N when killed by signal N."""
    rc, stderr = forkrun.call(_search, (str(out), where), timeout)
    return subprocess.CompletedProcess(["api", str(out), where], rc, "", stderr)


def vectors_shard(path: Path, *, rows: int, dim: int, seed: int, **columns: list[str]) -> np.ndarray:
    """A Parquet shard at ``path``: ``id`` 0 .. rows-1, the string ``columns`` given, and ``emb``: ``rows`` random
    float32 vectors of ``dim`` (``default_rng(seed)``) as a fixed-size list. Returns the vectors."""
    flat = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(rows), **columns,
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), dim)}), path)
    return flat


def index_vectors(data: Path, out: Path, *flags: str) -> Path:
    """``petal index DATA --out OUT -q --vectors-column emb FLAGS`` in its own process, which must succeed: OUT."""
    done = forkrun.petal(["index", str(data), "--out", str(out), "-q", "--vectors-column", "emb", *flags],
                         timeout=300)
    assert done.rc == 0, done.stderr[-2000:]
    return out


def vectors_index(root: Path, *flags: str, rows: int, dim: int, seed: int, queries: Sequence[int] = (0,),
                  **columns: list[str]) -> Path:
    """``root/v.parquet`` (``vectors_shard``) indexed into ``root/out`` (``index_vectors`` with ``flags``), beside
    ``root/q.npy``: the vectors of rows ``queries``, a ``--vector-file``. Returns ``root/out``."""
    flat = vectors_shard(root / "v.parquet", rows=rows, dim=dim, seed=seed, **columns)
    np.save(root / "q.npy", flat[list(queries)])
    return index_vectors(root / "v.parquet", root / "out", *flags)


def copy_index(built: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the index ``built`` (``tmp_path/out``) to damage, and its copy's live version directory."""
    out = tmp_path / "out"
    shutil.copytree(built, out)
    return out, out / "versions" / (out / "CURRENT").read_text().strip()


@contextmanager
def signed_manifest(version: Path) -> Iterator[dict[str, Any]]:
    """``version``'s manifest.json, to edit in the block; written back signed again (its own checksum over the
    edit): only an edit that signs it reaches the checks past the manifest's checksum."""
    path = version / "manifest.json"
    manifest = json.loads(path.read_text())
    yield manifest
    manifest.pop(CHECKSUM_KEY)
    manifest[CHECKSUM_KEY] = canonical_sha256(manifest)
    path.write_text(json.dumps(manifest, indent=2))


def record_files(version: Path, manifest: dict[str, Any], *, sha256: bool) -> None:
    """``manifest``'s records of ``version``'s files written again over the files as they are now: sizes and
    head/tail checksums, and with ``sha256`` the sha256 too (``index.files``' among them)."""
    for name, record in manifest[INTEGRITY_KEY]["files"].items():
        size = (version / name).stat().st_size
        record.update(size=size, head_tail_sha256=head_tail_sha256(version / name, size))
        if sha256:
            record["sha256"] = hashlib.sha256((version / name).read_bytes()).hexdigest()
            if name in manifest["index"]["files"]:
                manifest["index"]["files"][name] = record["sha256"]


def resign(version: Path, *, sha256: bool) -> None:
    """Records and the manifest's own checksum written again over the files as they are now: ``sha256`` too
    (a version consistent in every checksum, as petal verify sees it) or only sizes and head/tail checksums
    (what a change inside the body of a large file looks like to an open)."""
    with signed_manifest(version) as manifest:
        record_files(version, manifest, sha256=sha256)
