"""A damaged file of a published version gets one exit code from every way of reading the version: opening it
(``petal.open_index``, ``petal query``, ``petal info``) and ``petal verify`` (README "Integrity"). A listed file
that is missing or not a regular file inside the version (a directory, a FIFO, a symlink out, dangling or in a
loop) is refused with 78 before any checksum; one that is there but does not match its records (zero bytes) is 65.
Every file kind a version holds, in the three index layouts that hold them. Real CLI processes (forkrun, with a
timeout: a FIFO that blocked would fail the test, not hang it)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.index.checksums import INTEGRITY_KEY
from petal.pipeline.layout import OutputDir
from tests import forkrun
from tests.fake_cli import invoke as fake_invoke
from tests.fake_engine import make_fake_model_dir
from tests.test_open_integrity import _resigned, copy

ROWS, DIM = 5000, 64  # 1.3 MB of vectors: more than --index-memory 1M, so IVF8,Flat goes on disk
TIMEOUT_S = 90
COMMON = {"index.faiss", "ids.parquet", "rejects.parquet"}
# index layout -> (flags of petal index, the files its version holds besides manifest.json)
LAYOUTS = {
    "flat": (["--vectors-column", "emb"], COMMON),
    "binary": (["--quantize", "binary"], COMMON | {"rescore.npy"}),
    "ondisk": (["--vectors-column", "emb", "--index-factory", "IVF8,Flat", "--index-memory", "1M"],
               COMMON | {"index.ivfdata"}),
}


def _replace(path: Path, make: Callable[[Path], None]) -> None:
    path.unlink()
    make(path)


# what is put where a listed file was -> the code every reader exits with
DAMAGE: dict[str, tuple[Callable[[Path], None], int]] = {
    "missing": (lambda p: p.unlink(), 78),
    "directory": (lambda p: _replace(p, Path.mkdir), 78),
    "symlink out": (lambda p: _replace(p, lambda q: q.symlink_to(Path(__file__).resolve())), 78),
    "dangling symlink": (lambda p: _replace(p, lambda q: q.symlink_to("nowhere")), 78),
    "symlink loop": (lambda p: _replace(p, lambda q: q.symlink_to(q.name)), 78),
    "fifo": (lambda p: _replace(p, os.mkfifo), 78),
    "zero bytes": (lambda p: p.write_bytes(b""), 65),
}


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, Path]:
    """One published version per layout, over the same 5000 precomputed vectors (the fake model embeds the
    binary one)."""
    root = tmp_path_factory.mktemp("layouts")
    vectors = np.random.default_rng(0).standard_normal((ROWS, DIM)).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(ROWS), "text": [f"text {i}" for i in range(ROWS)],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), DIM)}),
                   root / "docs.parquet")
    np.save(root / "q.npy", vectors[:1])
    model = make_fake_model_dir(root / "model", dim=DIM)
    outs = {}
    for layout, (flags, _) in LAYOUTS.items():
        outs[layout] = root / layout
        extra = ["--model", str(model)] if "--vectors-column" not in flags else []
        result = fake_invoke(["index", str(root / "docs.parquet"), "--out", str(outs[layout]), "-q", *flags, *extra],
                             env={"PETAL_TEST_FAKE_ENGINE": str(root / f"log-{layout}")})
        assert result.exit_code == 0, result.output
    return outs


def codes(out: Path, query: Path) -> dict[str, tuple[int, str]]:
    """The exit code and stderr of each way of reading ``out``'s live version."""
    answers = {}
    for name, argv in (("query", ["query", out, "--vector-file", query]), ("info", ["info", out]),
                       ("verify", ["verify", out])):
        result = forkrun.petal(argv, timeout=TIMEOUT_S)
        assert "Traceback" not in result.stderr, result.stderr
        answers[name] = (result.rc, result.stderr)
    verdict = forkrun.petal(["verify", out, "--json"], timeout=TIMEOUT_S)
    answers["verify --json"] = (verdict.rc, verdict.stdout)
    try:
        petal.open_index(out)
        answers["open_index"] = (0, "")
    except petal.PetalError as exc:
        answers["open_index"] = (exc.exit_code, str(exc))
    return answers


def assert_one_code(answers: dict[str, tuple[int, str]], code: int, context: object = None) -> None:
    """Every reader exited with ``code``; ``verify --json``'s one object says it too."""
    assert {how: rc for how, (rc, _) in answers.items()} == dict.fromkeys(answers, code), (context, answers)
    report = json.loads(answers["verify --json"][1])
    assert report["ok"] is False and report["exit_code"] == code, (context, report)


def test_each_layout_holds_the_files_the_damage_cases_cover(layouts):
    for layout, out in layouts.items():
        version_dir = OutputDir(out).version_dir(OutputDir(out).current_version())
        assert {p.name for p in version_dir.iterdir()} - {"manifest.json"} == LAYOUTS[layout][1], layout


@pytest.mark.parametrize("layout, name", [(layout, name) for layout, (_, files) in LAYOUTS.items()
                                          for name in sorted(files)])
def test_a_damaged_file_is_one_exit_code_for_open_query_info_and_verify(layouts, tmp_path, layout, name):
    """``petal verify`` used to exit 65 for a file the open refuses with 78 (missing, not a regular file)."""
    for damage, (apply, code) in DAMAGE.items():
        out, version_dir = copy(layouts[layout], tmp_path / damage.replace(" ", "-"))
        apply(version_dir / name)
        answers = codes(out, layouts[layout].parent / "q.npy")
        assert_one_code(answers, code, damage)
        assert all(name in said for _, said in answers.values()), (damage, answers)


def test_a_refused_file_outranks_a_mismatched_one_in_open_and_verify(layouts, tmp_path):
    """``ids.parquet`` of zero bytes (65) sorts before a missing ``index.faiss`` (78): opening places every file
    before it checks any, as verify ranks them, so both exit 78 and verify names both files."""
    out, version_dir = copy(layouts["flat"], tmp_path)
    (version_dir / "ids.parquet").write_bytes(b"")
    (version_dir / "index.faiss").unlink()
    answers = codes(out, layouts["flat"].parent / "q.npy")
    assert_one_code(answers, 78)
    verified = answers["verify"][1]
    assert "index.faiss" in verified and "ids.parquet" in verified and "size 0 bytes" in verified, verified


def _unlist_index(manifest: dict) -> None:
    del manifest["index"]["files"]["index.faiss"], manifest[INTEGRITY_KEY]["files"]["index.faiss"]


def _list_outside(manifest: dict) -> None:
    record = manifest[INTEGRITY_KEY]["files"]["rejects.parquet"]
    manifest["index"]["files"]["../rejects.parquet"] = record["sha256"]
    manifest[INTEGRITY_KEY]["files"]["../rejects.parquet"] = record


@pytest.mark.parametrize("edit, says", [(_unlist_index, "index.faiss"), (_list_outside, "../rejects.parquet")])
def test_a_resigned_manifest_that_unlists_or_leads_out_is_78_everywhere(layouts, tmp_path, edit, says):
    """A manifest signed again without a required file, or listing a name outside the version: opening and
    verify both refuse it as a misplaced file (78); verify used to exit 65, opening 65 for the name."""
    out, version_dir = copy(layouts["flat"], tmp_path)
    shutil.copy(version_dir / "rejects.parquet", out / "versions" / "rejects.parquet")  # what the name reaches
    _resigned(version_dir, edit)
    answers = codes(out, layouts["flat"].parent / "q.npy")
    assert_one_code(answers, 78)
    assert all(says in said for _, said in answers.values()), answers
