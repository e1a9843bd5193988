"""JSON that holds an integer of more digits than Python converts (4,300: ``sys.int_max_str_digits``): ``json.loads``
raises a plain ``ValueError`` for it, not a ``JSONDecodeError``. Where only the latter was caught, a ``.jsonl`` input
line or a model's safetensors header holding such a number ended in a traceback (exit 1). Real CLI in its own
process (tests/forkrun.py), the packaged model's real files."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from tests import forkrun

HUGE = "1" + "0" * 5000


@pytest.mark.parametrize("line", ['{"text": "a text", "x": ' + HUGE + "}", '{"text": "a text", "id": ' + HUGE + "}",
                                  '{"x": ' + HUGE + "}"])
def test_a_jsonl_line_with_a_huge_integer_is_65_naming_it(tmp_path: Path, line: str) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "glaciers flow", "id": 1}\n' + line + "\n")
    for output, flags in (("out.npy", []), ("out.jsonl", ["--id-column", "id"])):
        done = forkrun.petal(["embed", "--input", str(path), "--output", str(tmp_path / output), *flags],
                             timeout=300)
        assert done.rc == 65 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert f"{path}:2: a number of more than 4300 digits" in done.last_line, done.last_line
        assert not (tmp_path / output).exists()


def test_a_safetensors_header_with_a_huge_integer_is_78_naming_the_file(minilm_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(minilm_dir, model)
    weights = model / "model.safetensors"
    raw = weights.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    header = b'{"extra": ' + HUGE.encode() + b", " + raw[8:8 + length][1:]
    header += b" " * (-len(header) % 8)
    weights.write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + length:])
    done = forkrun.petal(["embed", "a query", "--model", str(model)], timeout=120)
    assert done.rc == 78 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"{weights}: the header is not JSON" in done.last_line, done.last_line
