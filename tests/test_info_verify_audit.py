"""``petal info`` / ``petal verify`` (and ``petal query``'s open) on a manifest whose integrity records are not petal's.

petal seals a manifest with its records and its own checksum together (``checksums.py``): a manifest that matches its
checksum but has no ``integrity`` object, or an ``integrity.files`` that is no object, was edited and signed again.
Before: one without ``integrity`` (or with a string there) opened as a version written before records existed (info:
"written before head/tail checksums existed", verify: exit 0), and an ``integrity.files`` list was exit 65 "index.files
or integrity.files is not a mapping"; now 78 naming the key, as every other record that is not petal's. A manifest that
does not match its checksum vouches for nothing: its records' shape is never refused, every file is checked in full
(info: the warning and exit 0; verify: 65 on the manifest), where an ``integrity.files`` list was exit 65 from info.

Real Parquet, real FAISS, every command in its own process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.checksums import CHECKSUM_KEY, INTEGRITY_KEY, canonical_sha256
from tests.conftest import REPO

PETAL = [sys.executable, "-m", "petal.cli.main"]
DIM = 8


def petal_run(*argv: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PETAL, *map(str, argv)], capture_output=True, text=True, cwd=REPO, timeout=300,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("audit")
    ids = list(range(1, 9))
    flat = np.random.default_rng(5).standard_normal((len(ids), DIM)).astype(np.float32).ravel()
    (root / "data").mkdir()
    pq.write_table(pa.table({"id": ids, "text": [f"document {i}" for i in ids],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}),
                   root / "data" / "a.parquet")
    np.save(root / "q.npy", np.ones((1, DIM), np.float32))
    proc = petal_run("index", root / "data", "--out", root / "out", "--vectors-column", "emb")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root


def damaged(built: Path, tmp_path: Path, edit, sign: bool) -> Path:
    out = tmp_path / "out"
    shutil.copytree(built / "out", out)
    path = out / "versions" / (out / "CURRENT").read_text().strip() / "manifest.json"
    manifest = json.loads(path.read_text())
    assert canonical_sha256(manifest) == manifest[CHECKSUM_KEY]
    edit(manifest)
    if sign:
        manifest[CHECKSUM_KEY] = canonical_sha256(manifest)
    path.write_text(json.dumps(manifest))
    return out


def no_integrity(m: dict) -> None:
    del m[INTEGRITY_KEY]


def integrity_str(m: dict) -> None:
    m[INTEGRITY_KEY] = "x"


def files_list(m: dict) -> None:
    m[INTEGRITY_KEY]["files"] = []


def no_files(m: dict) -> None:
    del m[INTEGRITY_KEY]["files"]


SIGNED = {"no_integrity": (no_integrity, f"manifest key {INTEGRITY_KEY} is missing"),
          "integrity_str": (integrity_str, f"manifest key {INTEGRITY_KEY} is str"),
          "files_list": (files_list, f"manifest key {INTEGRITY_KEY}.files is list"),
          "no_files": (no_files, f"manifest key {INTEGRITY_KEY}.files is missing")}


@pytest.mark.parametrize("case", sorted(SIGNED))
def test_signed_manifest_without_petals_records_is_78_naming_the_key(built: Path, tmp_path: Path, case: str) -> None:
    edit, says = SIGNED[case]
    out = damaged(built, tmp_path, edit, sign=True)
    for argv in (("info", out), ("verify", out), ("verify", out, "--json"),
                 ("query", out, "--vector-file", built / "q.npy", "-k", "1")):
        proc = petal_run(*argv)
        assert proc.returncode == 78, (argv, proc.returncode, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr and says in proc.stderr, (argv, proc.stderr[-2000:])
        assert "written before head/tail checksums" not in proc.stderr
        if "--json" in argv:
            assert json.loads(proc.stdout)["exit_code"] == 78


@pytest.mark.parametrize("case", sorted(SIGNED))
def test_edited_manifest_records_of_any_shape_vouch_for_nothing(built: Path, tmp_path: Path, case: str) -> None:
    out = damaged(built, tmp_path, SIGNED[case][0], sign=False)
    proc = petal_run("info", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"does not match its own checksum ({CHECKSUM_KEY})" in proc.stderr and "Traceback" not in proc.stderr
    proc = petal_run("verify", out, "--json")
    assert proc.returncode == 65, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["exit_code"] == 65 and "does not match its own checksum" in report["manifest_checksum"]
    assert all(f["ok"] for f in report["files"]), report


def test_verify_version_whose_manifest_is_a_directory_says_so(built: Path, tmp_path: Path) -> None:
    """``--version V`` whose manifest.json is a directory: 78 saying it is a directory (before: "no manifest.json")."""
    out = tmp_path / "out"
    shutil.copytree(built / "out", out)
    version = (out / "CURRENT").read_text().strip()
    (out / "CURRENT").write_text("garbage\n")  # the version named is then checked by itself, not as the live one
    manifest = out / "versions" / version / "manifest.json"
    manifest.unlink()
    manifest.mkdir()
    for argv in (("verify", out, "--version", version), ("verify", out, "--version", version, "--json")):
        proc = petal_run(*argv)
        assert proc.returncode == 78 and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr[-2000:])
        assert "manifest.json is a directory" in proc.stderr and "no manifest.json" not in proc.stderr, proc.stderr


def test_report_lines_quote_a_path_with_a_newline(built: Path, tmp_path: Path) -> None:
    """The version line of ``petal info`` and ``petal verify`` is one line whatever OUT's name (quoted as in errors);
    before, a newline in OUT split it in two."""
    out = tmp_path / "a\nb"
    shutil.copytree(built / "out", out)
    for argv, prefix in ((("info", out), "version  "), (("verify", out), "version  ")):
        proc = petal_run(*argv)
        assert proc.returncode == 0, proc.stderr[-2000:]
        line = next(x for x in proc.stdout.splitlines() if x.startswith(prefix))
        assert '"' in line and "\\n" in line and line.rstrip(")").endswith(
            (out / "versions" / (out / "CURRENT").read_text().strip()).name + '"'), line


@pytest.mark.parametrize("kind", ["file", "directory", "link"])
def test_verify_names_an_entry_the_manifest_does_not_list(built: Path, tmp_path: Path, kind: str) -> None:
    """A sealed version holds its listed files and manifest.json only: anything else put there (a file, a directory, a
    link to a listed file) is a change petal verify reports, 65 naming it (before: exit 0, the version said whole)."""
    out = tmp_path / "out"
    shutil.copytree(built / "out", out)
    version = out / "versions" / (out / "CURRENT").read_text().strip()
    extra = version / "stray.bin"
    if kind == "file":
        extra.write_bytes(b"not petal's")
    elif kind == "directory":
        extra.mkdir()
    else:
        extra.symlink_to("index.faiss")
    proc = petal_run("verify", out)
    assert proc.returncode == 65, proc.stderr[-2000:]
    assert "stray.bin" in proc.stderr.strip().splitlines()[-1] and "Traceback" not in proc.stderr
    report = json.loads(petal_run("verify", out, "--json").stdout)
    assert report["exit_code"] == 65
    assert [f["name"] for f in report["files"] if not f["ok"]] == ["stray.bin"]
    extra.rmdir() if kind == "directory" else extra.unlink()
    assert petal_run("verify", out).returncode == 0
