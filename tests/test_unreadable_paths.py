"""Paths petal cannot use because of their permissions or kind, one code per role, one line naming it.

- The output directory of a writer (``petal index --out``, ``petal rebuild OUT``) that is not a directory, cannot be
  read, entered or written, or (not there yet) cannot be created, is 73 ("cannot create output"), naming the flag
  or argument and the path, before any source, model or lock is touched (was: 2 from click's "Path ... is not
  readable" for an unreadable one, 74 "I/O error" for one under a directory that cannot be entered, 74 after the
  whole rebuild for a read-only OUT). ``petal rebuild`` of a path that holds no index stays 78.
- ``--json-report`` is an output too: an existing report this process cannot read is replaced (was: 2).
- A source shard or directory this process may not read (permission denied) is no input, 66, in text and
  ``--vectors-column`` runs alike, said at once (not retried: it is not transient) naming it.

Real files, real Parquet, real FAISS and the packaged MiniLM, in processes that cannot bypass file permissions
(``run_unprivileged``: root without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir
from tests.test_input_files import run_unprivileged


def write_docs(path: Path) -> Path:
    """3 documents with text (for the packaged MiniLM) and precomputed vectors (``--vectors-column emb``)."""
    emb = pa.FixedSizeListArray.from_arrays(pa.array(np.eye(3, 8, dtype=np.float32).ravel()), 8)
    pq.write_table(pa.table({"id": pa.array([1, 2, 3], pa.int64()),
                             "text": ["glaciers flow downhill", "bread needs yeast", "lava cools into rock"],
                             "emb": emb}), path)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory, minilm_dir) -> Path:
    """An index of the packaged MiniLM (``--out``), built by a real run."""
    root = tmp_path_factory.mktemp("built")
    docs = write_docs(root / "docs.parquet")
    proc = run_unprivileged(["index", str(docs), "--out", str(root / "out"), "-q"], root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root / "out"


def last_error(proc) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("petal: error: "), proc.stderr[-2000:]
    return last


def unusable_outs(root: Path) -> dict[str, tuple[Path, str]]:
    """Output directories petal cannot use, each with what the error says about it."""
    (root / "closed").mkdir(mode=0o755)
    (root / "closed" / "old").mkdir()
    (root / "readonly").mkdir()
    (root / "a-file").write_text("not a directory")
    os.mkfifo(root / "a-fifo")
    return {"mode 000": (root / "closed", "cannot be read (Permission denied)"),
            "mode 555": (root / "readonly", "cannot be written (Permission denied)"),
            "under a mode-000 directory": (root / "closed" / "new", "cannot be created (Permission denied)"),
            "a file": (root / "a-file", "is a file, not a directory"),
            "a FIFO": (root / "a-fifo", "is a FIFO, not a directory"),
            "under a file": (root / "a-file" / "out", "cannot be created (Not a directory)")}


@pytest.mark.parametrize("how", ["text", "vectors"])
def test_index_out_that_cannot_be_used_is_73_naming_the_flag_before_any_work(tmp_path, minilm_dir, how):
    """A text run of the packaged MiniLM and a --vectors-column run: 73 naming --out and the path, the report
    written (was: 2 'Path ... is not readable' for mode 000, 74 'I/O error' under a mode-000 directory)."""
    docs = write_docs(tmp_path / "docs.parquet")
    cases = unusable_outs(tmp_path)
    (tmp_path / "closed").chmod(0)
    (tmp_path / "readonly").chmod(0o555)
    extra = ["--vectors-column", "emb", "--index-factory", "Flat"] if how == "vectors" else []
    try:
        for case, (out, said) in cases.items():
            report = tmp_path / "report.json"
            report.unlink(missing_ok=True)
            proc = run_unprivileged(["index", str(docs), "--out", str(out), "-q", "--json-report", str(report),
                                     *extra], tmp_path)
            assert proc.returncode == 73, (case, proc.returncode, proc.stderr[-2000:])
            sep = " " if said.startswith("is ") else ": "
            assert last_error(proc).startswith(f"petal: error: --out {out}{sep}{said}"), (case, proc.stderr[-2000:])
            data = json.loads(report.read_text())
            assert data["status"] == "failed" and data["exit_code"] == 73 and f"--out {out}" in data["message"]
    finally:
        (tmp_path / "closed").chmod(0o755)
        (tmp_path / "readonly").chmod(0o755)
    assert [p.name for p in (tmp_path / "closed").iterdir()] == ["old"] and not any((tmp_path / "readonly").iterdir())


def test_index_out_is_judged_before_the_model_is_looked_at(tmp_path):
    """The order: a model that is not there (78 when it is looked at) does not hide an output that cannot be made."""
    docs = write_docs(tmp_path / "docs.parquet")
    (tmp_path / "closed").mkdir(mode=0)
    try:
        proc = run_unprivileged(["index", str(docs), "--out", str(tmp_path / "closed"), "-q",
                                 "--model", str(tmp_path / "no-model")], tmp_path)
    finally:
        (tmp_path / "closed").chmod(0o755)
    assert proc.returncode == 73 and f"--out {tmp_path / 'closed'}: cannot be read" in last_error(proc)


def test_rebuild_out_that_cannot_be_read_or_written_is_73_and_leaves_the_index_as_it_was(built, tmp_path):
    """petal rebuild OUT: mode 000 was 2 (click's 'Path ... is not readable'); a read-only OUT was 74 after the whole
    index was built; now 73 naming OUT at once, nothing staged. A path with no index stays 78."""
    out = tmp_path / "out"
    shutil.copytree(built, out)
    live = OutputDir(out).current_version()
    versions = sorted(p.name for p in (out / "versions").iterdir())
    for mode, said in ((0, "cannot be read (Permission denied)"), (0o555, "cannot be written (Permission denied)")):
        out.chmod(mode)
        try:
            proc = run_unprivileged(["rebuild", str(out), "--index-factory", "Flat"], tmp_path)
        finally:
            out.chmod(0o755)
        assert proc.returncode == 73, (oct(mode), proc.returncode, proc.stderr[-2000:])
        assert last_error(proc) == f"petal: error: OUT {out}: {said}; petal reads and writes its output directory"
        assert OutputDir(out).current_version() == live
        assert sorted(p.name for p in (out / "versions").iterdir()) == versions  # no staging, no new version
    (tmp_path / "a-file").write_text("x")
    for nothing in (tmp_path / "missing", tmp_path / "a-file"):
        proc = run_unprivileged(["rebuild", str(nothing)], tmp_path)
        assert proc.returncode == 78, (nothing, proc.returncode, proc.stderr[-2000:])
    proc = run_unprivileged(["rebuild", str(out), "--index-factory", "Flat"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("command", ["index", "rebuild"])
def test_an_existing_report_that_cannot_be_read_is_an_output_replaced_not_a_usage_error(built, tmp_path, command):
    """--json-report names an output: one that exists with mode 000 is replaced by the run's report, exit 0
    (was: 2, click's 'Path ... is not readable', and no run)."""
    out = tmp_path / "out"
    shutil.copytree(built, out)
    report = tmp_path / "report.json"
    report.write_text("{}")
    report.chmod(0)
    argv = (["index", str(built.parent / "docs.parquet"), "--out", str(out), "-q"] if command == "index"
            else ["rebuild", str(out), "--index-factory", "Flat"])
    proc = run_unprivileged([*argv, "--json-report", str(report)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "warning" not in proc.stderr
    data = json.loads(report.read_text())
    assert data["exit_code"] == 0 and data["status"] in ("success", "nothing-to-do") and data["command"] == command


# --- source shards this process may not read ------------------------------------------------------------------

@pytest.mark.parametrize("how", ["text", "vectors"])
def test_a_source_shard_or_directory_that_cannot_be_read_is_no_input_in_both_run_kinds(tmp_path, minilm_dir, how):
    """Permission denied on a source is no input (66), said at once naming it, never retried and nothing published,
    in a text run of the packaged MiniLM and a --vectors-column run alike (was: a text run retried it 3 times and
    exited 74 'read error after 3 retries ... rerun when the storage recovers', --vectors-column 65 'not a readable
    Parquet file'; a source directory that cannot be listed was 65, one above a named shard 74)."""
    data = tmp_path / "data"
    data.mkdir()
    write_docs(data / "a.parquet")
    secret = write_docs(data / "secret.parquet")
    (tmp_path / "closed").mkdir()
    write_docs(tmp_path / "closed" / "c.parquet")
    extra = ["--vectors-column", "emb", "--index-factory", "Flat"] if how == "vectors" else []
    out, report = tmp_path / "out", tmp_path / "report.json"
    secret.chmod(0)
    (tmp_path / "closed").chmod(0)
    try:
        for source, named in ((data, secret), (secret, secret), (tmp_path / "closed", tmp_path / "closed"),
                              (tmp_path / "closed" / "c.parquet", tmp_path / "closed" / "c.parquet")):
            proc = run_unprivileged(["index", str(source), "--out", str(out), "-q", "--json-report", str(report),
                                     *extra], tmp_path)
            assert proc.returncode == 66, (source, proc.returncode, proc.stderr[-2000:])
            assert last_error(proc) == f"petal: error: {named}: cannot be read (Permission denied)"
            data_report = json.loads(report.read_text())
            assert data_report["exit_code"] == 66 and data_report["retries"]["read"] == 0  # not transient
            assert not (out / "CURRENT").exists()
    finally:
        secret.chmod(0o644)
        (tmp_path / "closed").chmod(0o755)
    proc = run_unprivileged(["index", str(data), "--out", str(out), "-q", *extra], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]  # readable again: the same command indexes both shards
