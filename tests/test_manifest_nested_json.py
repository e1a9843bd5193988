"""A ``manifest.json`` nested past Python's recursion limit (``[[[[...``: damaged or planted) is 78 naming the file
from ``petal query``, ``petal info`` (``--json`` too), ``petal verify`` and ``petal.open_index``: ``json.loads`` raised
a RecursionError, a traceback (exit 1) in every command.

Real Parquet, real FAISS; each command in its own process (tests/forkrun.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import forkrun
from tests._open_audit_shared import api, copy_index, vectors_index


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vectors_index(tmp_path_factory.mktemp("nested"), rows=40, dim=8, seed=2)


@pytest.mark.parametrize("nested", ["[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000])
def test_a_manifest_nested_too_deeply_is_78_naming_it(built: Path, tmp_path: Path, nested: str) -> None:
    out, version = copy_index(built, tmp_path)
    (version / "manifest.json").write_text(nested)
    q = str(built.parent / "q.npy")
    for argv in (["query", str(out), "--vector-file", q], ["info", str(out)], ["verify", str(out)],
                 ["info", str(version)], ["verify", str(out), "--version", version.name]):
        done = forkrun.petal(argv)
        assert done.rc == 78 and "Traceback" not in done.stderr, (argv, done.stderr[-2000:])
        assert "manifest.json" in done.last_line and "nested too deeply" in done.last_line, done.last_line
    as_json = forkrun.petal(["info", str(out), "--json"])
    assert as_json.rc == 78 and json.loads(as_json.stdout)["exit_code"] == 78, as_json.stdout + as_json.stderr
    opened = api(out)
    assert opened.returncode == 78 and "nested too deeply" in opened.stderr, opened.stderr[-2000:]
