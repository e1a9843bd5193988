"""A pointer of OUT that is no version id (``CURRENT``, ``.last-version``) is shown far enough past the 24 characters
of an id that what is wrong with it shows: one that starts with a valid id ('v...Z.bak', two ids on two lines) was
cut at 24, exactly the valid id, as 'holds "v000001-..."..., which is not a petal version id'."""

from __future__ import annotations

from pathlib import Path

import pytest

from petal.pipeline.layout import OutputDir
from petal.pipeline.reliability.errors import ConfigError

ID = "v000001-20990101T000000Z"
POINTERS = {
    "suffix": (f"{ID}.bak\n", f'"{ID}.bak"'),
    "two ids": (f"{ID}\nv000002-20990101T000000Z\n", f'"{ID}\\nv000002-20990101T000000Z"'),
    "long": (ID + "x" * 100, f'"{ID}{"x" * 40}..."'),  # still cut: 64 characters of at most 256 read
}


@pytest.mark.parametrize("case", list(POINTERS))
def test_current_shows_what_follows_a_valid_id(tmp_path: Path, case: str) -> None:
    text, shown = POINTERS[case]
    (tmp_path / "versions").mkdir()
    (tmp_path / "CURRENT").write_text(text)
    with pytest.raises(ConfigError) as caught:
        OutputDir(tmp_path).current_version()
    assert f"CURRENT holds {shown}, which is not a petal version id" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("case", list(POINTERS))
def test_last_version_shows_what_follows_a_valid_id(tmp_path: Path, case: str) -> None:
    text, shown = POINTERS[case]
    (tmp_path / ".last-version").write_text(text)
    number, problem = OutputDir(tmp_path)._last_version()
    assert number == 0 and problem is not None and f"handed out) holds {shown}, which is not" in problem, problem
