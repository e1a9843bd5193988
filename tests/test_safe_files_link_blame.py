"""A file reached through a directory that is a symbolic link out of its root is refused (78) naming that link, the
one to remove, not each file reached through it (``safe_files.check_regular``): 'OUT/versions/V/manifest.json leads
out of OUT' hid that OUT/versions was the link. A file that is itself the link out is named as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from petal.pipeline.reliability.safe_files import UnsafeFileError, check_regular, read_regular


def test_a_directory_linked_out_is_the_one_named(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    (elsewhere / "v1").mkdir(parents=True)
    (elsewhere / "v1" / "manifest.json").write_text("{}")
    root.mkdir()
    (root / "versions").symlink_to(elsewhere)
    path = root / "versions" / "v1" / "manifest.json"
    for read in (check_regular, read_regular):
        with pytest.raises(UnsafeFileError) as caught:
            read(path, root)
        said = str(caught.value)
        assert said.startswith(f"{root / 'versions'} leads out of {root} (a symlink) on the way to {path};"), said


def test_a_file_linked_out_is_named_itself(tmp_path: Path) -> None:
    root = tmp_path / "out"
    (root / "versions" / "v1").mkdir(parents=True)
    (tmp_path / "secret").write_text("x")
    path = root / "versions" / "v1" / "manifest.json"
    path.symlink_to(tmp_path / "secret")
    with pytest.raises(UnsafeFileError) as caught:
        check_regular(path, root)
    assert str(caught.value).startswith(f"{path} leads out of {root} (a symlink); refusing"), str(caught.value)
