"""An ``ids.parquet`` whose footer parses but names its columns otherwise (issue 14, item 3: a tampered file never
crashes the process): a column ``shard`` renamed, or a column name that is not UTF-8, under a manifest signed again
over the file. pyarrow raised KeyError (the dictionary-decoded ``shard`` it was asked for) or UnicodeDecodeError:
petal verify was a traceback (exit 1) and petal query blamed manifest.json (78). Both are 65 naming ids.parquet."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tests import forkrun
from tests._open_audit_shared import copy_index, resign, vectors_index

ROWS, DIM = 200, 8


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vectors_index(tmp_path_factory.mktemp("ids_footer"), "--index-factory", "Flat", rows=ROWS, dim=DIM, seed=3)


def rename_in_footer(path: Path, old: bytes, new: bytes) -> None:
    """Every ``old`` column name in the Parquet footer of ``path`` (its thrift metadata) written as ``new``."""
    assert len(old) == len(new)
    blob = path.read_bytes()
    (length,) = struct.unpack("<I", blob[-8:-4])
    start = len(blob) - 8 - length
    footer = blob[start:-8]
    assert old in footer
    path.write_bytes(blob[:start] + footer.replace(old, new) + blob[-8:])


@pytest.mark.parametrize("name", [b"shxrd", b"sh\xa9rd"], ids=["shard renamed", "name not UTF-8"])
def test_an_ids_footer_that_names_other_columns_is_damage_naming_the_file(built, tmp_path, name):
    out, version = copy_index(built, tmp_path)
    rename_in_footer(version / "ids.parquet", b"shard", name)
    resign(version, sha256=True)
    for argv in (["verify", str(out)], ["query", str(out), "--vector-file", str(built.parent / "q.npy"), "-k", "3"]):
        run = forkrun.petal(argv, timeout=300)
        assert run.rc == 65, (argv[0], run.rc, run.stderr[-2000:])
        assert "Traceback" not in run.stderr and "ids.parquet" in run.last_line, run.stderr[-2000:]
    run = forkrun.petal(["verify", str(out), "--json"], timeout=300)
    verdict = json.loads(run.stdout)
    assert run.rc == 65 and [f["name"] for f in verdict["files"] if not f["ok"]] == ["ids.parquet"], run.stdout
