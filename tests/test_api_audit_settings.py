"""``petal.index`` keywords that ``pipeline/jobs/settings.py`` converts: one of the wrong type is a ``petal.UsageError``
naming it (README "Python API"), never a ``TypeError`` from ``pathlib`` or ``os.fspath`` deep inside."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal


@pytest.fixture
def shards(tmp_path) -> Path:
    path = tmp_path / "shards"
    path.mkdir()
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["glaciers flow downhill", "espresso is coffee"]}),
                   path / "s.parquet")
    return path


@pytest.mark.parametrize(("settings", "named"), [
    ({"delete": 5}, r"delete: 5 is an int, not a path"),
    ({"keep_columns": 5}, r"keep_columns .*: column names are strings, not 5"),
])
def test_index_path_and_column_settings_of_the_wrong_type(shards, tmp_path, settings, named):
    """``delete=5`` was a TypeError from pathlib, ``keep_columns=5`` "'int' object is not iterable"."""
    with pytest.raises(petal.UsageError, match=named):
        petal.index(shards, tmp_path / "o", **settings)
    assert not (tmp_path / "o").exists()


def test_a_source_that_is_none_is_named(shards, tmp_path):
    """``sources=[None]`` (an unset variable in a list) was a TypeError from ``os.fspath``: the check that names a
    source of the wrong type took the ``None`` it found for "none found"."""
    for sources in ([None], [shards, None]):
        with pytest.raises(petal.UsageError, match=r"sources: None is a NoneType, not a path"):
            petal.index(sources, tmp_path / "o")


@pytest.mark.parametrize("sources", [b"/data/shards", bytearray(b"/data/shards"), memoryview(b"/data/shards")])
def test_a_bytes_source_is_named_whole(shards, tmp_path, sources):
    """``petal.index(b"/data/shards", OUT)`` took the bytes as a list of sources and said "sources: 47 is an int" (the
    code of "/"): bytes are named whole, as ``out=b"..."`` is."""
    with pytest.raises(petal.UsageError, match=r"^sources: .* is an? \w+, not a path, a glob or a list"):
        petal.index(sources, tmp_path / "o")
    assert not (tmp_path / "o").exists()
