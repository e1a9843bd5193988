"""``petal embed --input FILE.jsonl`` with a line nested past Python's recursion limit (``[[[[...``) is 65 naming the
file and line, as any line that is no JSON object with a "text" field: ``json.loads`` raised a RecursionError, a
traceback (exit 1). Real CLI in its own process (tests/forkrun.py), refused before the model loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import forkrun


@pytest.mark.parametrize("line", ["[" * 100_000 + "]" * 100_000, '{"text": ' + "[" * 100_000 + "]" * 100_000 + "}"])
def test_a_jsonl_line_nested_too_deeply_is_65_naming_it(tmp_path: Path, line: str) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "glaciers flow"}\n' + line + "\n")
    done = forkrun.petal(["embed", "--input", str(path), "--output", str(tmp_path / "out.npy")], timeout=300)
    assert done.rc == 65 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"{path}:2: expected a JSON object" in done.last_line, done.last_line
    assert not (tmp_path / "out.npy").exists()
