"""A signed manifest whose query-model keys hold a value petal does not write (``model.pooling``, ``model.attention``
not one of the engine's choices, a text model's ``max_length`` below 2) is 78 naming the key, from ``petal query``,
``petal info`` and ``petal.open_index`` alike: the typed manifest refuses it, as it refuses a ``metric``. They were
handed to the query model's options as they were: ``Error: max_length 0 < 2`` or ``--attention-mask 'x' is not one
of ...``, exit 2, a usage error blaming flags nobody gave (and ``petal info`` said nothing).

Real Parquet, the packaged MiniLM, real FAISS; each command in its own process (tests/forkrun.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import forkrun
from tests._open_audit_shared import api, copy_index, signed_manifest


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model_keys")
    data = root / "docs.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["glaciers flow downhill", "bread needs yeast", "lava"]}), data)
    out = root / "out"
    done = forkrun.petal(["index", str(data), "--out", str(out), "-q", "--index-factory", "Flat"], timeout=300)
    assert done.rc == 0, done.stderr[-2000:]
    return out


CASES: dict[str, tuple[tuple[str, ...], Any]] = {
    "max_length 0": (("max_length",), 0), "max_length -1": (("max_length",), -1),
    "model.attention": (("model", "attention"), "x"), "model.pooling": (("model", "pooling"), "sum"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_query_model_key_petal_does_not_write_is_78_naming_it(built: Path, tmp_path: Path, case: str) -> None:
    out, version = copy_index(built, tmp_path)
    keys, value = CASES[case]
    with signed_manifest(version) as manifest:  # signed again: only an edit that signs it makes one
        section = manifest
        for key in keys[:-1]:
            section = section[key]
        section[keys[-1]] = value
    named = f"manifest key {'.'.join(keys)} is"
    query = forkrun.petal(["query", str(out), "glaciers", "-k", "1"], timeout=300)
    assert query.rc == 78 and named in query.last_line and "manifest.json" in query.last_line, query.stderr[-2000:]
    info = forkrun.petal(["info", str(out)])
    assert info.rc == 78 and named in info.last_line, info.stderr[-2000:]
    opened = api(out)
    assert opened.returncode == 78 and named in opened.stderr, opened.stderr[-2000:]


def test_the_index_as_written_still_answers(built: Path) -> None:
    query = forkrun.petal(["query", str(built), "glaciers", "-k", "1", "--json"], timeout=300)
    assert query.rc == 0 and json.loads(query.stdout)["hits"][0]["id"] == 1, query.stderr[-2000:]
