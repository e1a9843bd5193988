"""An ``index.faiss`` whose body (past the head/tail checksums) names a part as ``null``: FAISS reads a ``null`` tag
where a sub-index belongs (an IVF's quantizer, an HNSW's storage, a refine or pre-transformed index) and ``il00``
where the inverted lists belong as no part at all, and the file parses. Opening such an IVF crashed on a NULL
downcast (SystemError, exit 1), an HNSW opened and crashed at its first search; now every open (the API, ``petal
query``) refuses it with 65 naming ``index.faiss`` and the part, and so does ``petal verify`` once every checksum is
signed again over the change (a version consistent in every checksum but the index's structure).

Real components: small indexes petal builds from a Parquet shard of random vectors, damaged by hand, each open in
a forked child (a crash ends the child, not the test run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import forkrun
from tests._open_audit_shared import api, copy_index, resign, vectors_index

# factory, the tag replaced (its last occurrence), what replaces it, the part the message names
CASES = [
    ("IVF16,Flat", b"ilar", b"il00", "no inverted lists"),
    ("IVF16,Flat", b"IxFI", b"null", ""),  # the quantizer: what follows no longer parses (65 either way)
    ("HNSW16", b"IxFI", b"null", "no storage index"),
    ("IVF16,Flat,RFlat", b"IxFI", b"null", "refine"),  # FAISS refuses this one itself
    ("PCA8,IVF16,Flat", b"IwFl", b"null", "no index index"),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    indexes = {}
    for factory in dict.fromkeys(case[0] for case in CASES):
        root = tmp_path_factory.mktemp(factory.replace(",", "_"))
        indexes[factory] = vectors_index(root, "--index-factory", factory, rows=2000, dim=16, seed=3)
    return indexes


@pytest.mark.parametrize(("factory", "tag", "null", "said"), CASES, ids=lambda v: v.decode() if isinstance(v, bytes)
                         else v.replace(",", "_") if isinstance(v, str) else None)
def test_a_null_part_in_the_body_is_65_at_open_and_at_verify(built, tmp_path, factory, tag, null, said):
    out, version = copy_index(built[factory], tmp_path)
    path = version / "index.faiss"
    data = bytearray(path.read_bytes())
    at = data.rfind(tag)
    assert at > 0, (factory, tag)
    data[at:at + 4] = null
    path.write_bytes(bytes(data))
    resign(version, sha256=False)  # sizes and head/tail checksums over the change: a body change, to an open

    opened = api(out)
    assert opened.returncode == 65, opened.stderr[-2000:]
    assert "index.faiss" in opened.stderr and said in opened.stderr and "Traceback" not in opened.stderr
    query = forkrun.petal(["query", str(out), "--vector-file", str(built[factory].parent / "q.npy"), "-k", "3"])
    assert query.rc == 65 and "index.faiss" in query.stderr and "Traceback" not in query.stderr, query.stderr[-2000:]

    resign(version, sha256=True)  # every checksum signed over it: only reading the index finds it
    verified = forkrun.petal(["verify", str(out)])
    assert verified.rc == 65 and "index.faiss" in verified.stdout + verified.stderr, verified.stderr[-2000:]
    assert "Traceback" not in verified.stderr
