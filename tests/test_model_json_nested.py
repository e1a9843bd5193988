"""A model file whose JSON is nested past Python's recursion limit (``[[[[...``: ``config.json``, the safetensors
header) is a model petal cannot use: 78 naming the file from ``petal embed`` (and every command that inspects a
model), before anything loads; ``json.loads`` raised a RecursionError, a traceback (exit 1).

The packaged MiniLM copied and damaged; the real CLI in its own process (tests/forkrun.py)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from petal.engine.loader import default_model_dir
from tests import forkrun

NESTED = b"[" * 100_000 + b"]" * 100_000


def _config(model: Path) -> str:
    (model / "config.json").write_bytes(NESTED)
    return "config.json"


def _safetensors_header(model: Path) -> str:
    (model / "model.safetensors").write_bytes(len(NESTED).to_bytes(8, "little") + NESTED)
    return "model.safetensors"


DAMAGE: dict[str, Callable[[Path], str]] = {"config.json": _config, "safetensors header": _safetensors_header}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_model_json_nested_too_deeply_is_78_naming_it(tmp_path: Path, damage: str) -> None:
    model = tmp_path / "model"
    shutil.copytree(default_model_dir(), model)
    name = DAMAGE[damage](model)
    done = forkrun.petal(["embed", "glaciers", "--model", str(model)], timeout=300)
    assert done.rc == 78 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert f"{model / name}" in done.last_line, done.last_line
