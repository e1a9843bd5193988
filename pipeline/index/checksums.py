"""Checksums recorded when a version is written, so that opening it costs O(1) in its size.

A sealed ``manifest.json`` carries:

```
"integrity": {"head_tail_bytes": 1048576,
              "files": {"index.faiss": {"size": 4294967341, "sha256": "...", "head_tail_sha256": "..."}, ...}},
"manifest_sha256": "..."   sha256 of the manifest's canonical JSON without this key
```

``head_tail_sha256`` hashes the file's size, its first and its last ``head_tail_bytes`` (the whole
file when it is at most twice that): FAISS and Parquet keep their headers and footers there, so a
truncated, swapped or rewritten file fails it. A change inside the body of a large file passes it;
``petal verify`` (full sha256 of every byte) finds that.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, BinaryIO

from petal.pipeline.manifest import CHECKSUM_KEY, INTEGRITY_KEY, MANIFEST_FILE, raw_index_files

HEAD_TAIL_BYTES = 1 << 20
# NOTE: the largest head/tail span a reader accepts from a manifest (petal writes HEAD_TAIL_BYTES): the span sizes
# what every open reads; a manifest signed again with a span of 2^60 would make each open hash whole multi-GB files
# (O(size), what the records exist to avoid). Refused above this (verify.checked_records: 78 naming the key)
MAX_HEAD_TAIL_BYTES = 64 << 20
READ_CHUNK = 1 << 22  # bytes a checksum reads at a time (sha256_file, head_tail_sha256_of)


def sha256_file(path: Path | str) -> str:
    """sha256 of every byte of ``path`` (read in 4 MiB chunks); ``UnsafeFileError`` when it is not a regular file.

    NOTE: opened without blocking, then checked: a FIFO swapped in after a caller's own check (``petal verify``,
    a store shard) is refused instead of blocking the process for good."""
    import stat

    from petal.pipeline.reliability.errors import quote_path
    from petal.pipeline.reliability.safe_files import UnsafeFileError

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafeFileError(f"{quote_path(Path(path))} is not a regular file; refusing to read it")
        os.set_blocking(fd, True)
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    digest = hashlib.sha256()
    with fh:
        while chunk := fh.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def head_tail_sha256(path: Path, size: int, span: int = HEAD_TAIL_BYTES) -> str:
    """sha256 of ``size`` (8 bytes, little endian), the first ``span`` and the last ``span`` bytes of ``path``."""
    with open(path, "rb") as fh:
        return head_tail_sha256_of(fh, size, span)


def head_tail_sha256_of(fh: BinaryIO, size: int, span: int = HEAD_TAIL_BYTES) -> str:
    """``head_tail_sha256`` of an open binary file ``fh`` (read from its start), read ``READ_CHUNK`` bytes at a time.

    NOTE: never one read of ``span`` (or ``size``) bytes: that buffer was allocated whole, so a large span held that
    much memory (what ``MAX_HEAD_TAIL_BYTES`` bounds is time; this, memory)."""
    digest = hashlib.sha256(size.to_bytes(8, "little"))
    if size <= 2 * span:
        _hash_bytes(digest, fh, size)
    else:
        _hash_bytes(digest, fh, span)
        fh.seek(size - span)
        _hash_bytes(digest, fh, span)
    return digest.hexdigest()


def _hash_bytes(digest: Any, fh: BinaryIO, count: int) -> None:
    """Add the next ``count`` bytes of ``fh`` to ``digest`` (fewer at its end), ``READ_CHUNK`` at a time."""
    while count > 0:
        chunk = fh.read(min(count, READ_CHUNK))
        if not chunk:
            return
        digest.update(chunk)
        count -= len(chunk)


def canonical_sha256(manifest: dict[str, Any]) -> str:
    """sha256 of ``manifest`` as canonical JSON (sorted keys, no spaces, UTF-8), without ``manifest_sha256``."""
    body = {k: v for k, v in manifest.items() if k != CHECKSUM_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def seal_manifest(version_dir: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` with the ``integrity`` records of every file of ``version_dir`` and its own checksum.

    Full sha256 values the index writer computed (``index.files``) are reused, not read again.
    """
    known: dict[str, str] = dict(raw_index_files(manifest))
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(version_dir).iterdir()):
        if path.name == MANIFEST_FILE or path.name.startswith(".") or not path.is_file():
            continue
        size = os.stat(path).st_size
        files[path.name] = {"size": size, "sha256": known.get(path.name) or sha256_file(path),
                            "head_tail_sha256": head_tail_sha256(path, size)}
    sealed = {k: v for k, v in manifest.items() if k != CHECKSUM_KEY}
    sealed[INTEGRITY_KEY] = {"head_tail_bytes": HEAD_TAIL_BYTES, "files": files}
    # NOTE: hashed as it will read back (int keys become strings, tuples lists, paths strings), so the
    # reader's canonical form of the written file is the same.
    sealed = json.loads(json.dumps(sealed, default=str))
    sealed[CHECKSUM_KEY] = canonical_sha256(sealed)
    return sealed
