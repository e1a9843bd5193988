"""The installed ``petal`` is a typed package (PEP 561 ``py.typed``): mypy checks code that imports it against
petal's annotations (a search's ``list[list[petal.Hit]]`` assigned to an ``int`` is an error), where before it
said "module is installed, but missing library stubs or py.typed marker" and took every name as ``Any``; and the
annotations take every input the README documents (a null text, bytes, a tuple mixing them, a numpy integer ``k``,
paths as ``pathlib.Path``), which they refused: ``Iterable[str]`` for queries, ``int`` for ``k``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_install import wheel_venv  # noqa: F401  (the installed wheel's fixture)


@pytest.mark.slow
def test_mypy_takes_petals_annotations_in_code_that_imports_it(wheel_venv: Path, tmp_path: Path):  # noqa: F811
    script = tmp_path / "use.py"
    script.write_text('import petal\n\n'
                      'hits: list[list[petal.Hit]] = petal.open_index("idx").search("a query", k=3)\n'
                      'wrong: int = petal.open_index("idx").search("a query")\n')
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--python-executable",
                             str(wheel_venv / "bin" / "python"), str(script)], capture_output=True, text=True,
                            timeout=600, cwd=tmp_path)
    said = result.stdout + result.stderr
    assert "import-untyped" not in said and "py.typed" not in said, said
    assert said.count("error:") == 1 and "use.py:4: error: Incompatible types in assignment" in said, said


DOCUMENTED_CALLS = """\
from pathlib import Path

import numpy as np

import petal

index = petal.open_index(Path("idx"), model=Path("m"), nprobe=4)
texts: list[str | None] = ["a", None]
a: list[list[petal.Hit]] = index.search(texts, k=np.int64(3))
b: list[list[petal.Hit]] = index.search(b"bytes")
c: list[list[petal.Hit]] = index.search(np.zeros((1, 384), dtype=np.float32), where="lang = 'en'")
d: list[list[petal.Hit]] = index.search(x for x in ["a", "b"])
e: list[list[petal.Hit]] = index.search(("a", b"b"))
f: list[list[petal.Hit]] = index.search_stored(np.zeros((1, 384), dtype=np.float32), np.int32(3))
g: list[str | None] = index.texts(a[0])
embedder = petal.Embedder(Path("m"), calibration=Path("idx"), quantize="int8")
v: np.ndarray = embedder.encode(["a", None, b"c"], query=True, batch_tokens=np.int64(512))
w: np.ndarray = embedder.encode(b"one")
report = petal.index([Path("a"), "b"], Path("out"), json_report=Path("r.json"))
status: str = petal.rebuild(Path("out"), json_report=Path("r.json"), wait=True).status
with petal.open_index("idx") as opened, petal.Embedder() as emb:
    pass
"""


@pytest.mark.slow
def test_the_annotations_take_every_documented_input(wheel_venv: Path, tmp_path: Path):  # noqa: F811
    script = tmp_path / "documented.py"
    script.write_text(DOCUMENTED_CALLS)
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--python-executable",
                             str(wheel_venv / "bin" / "python"), str(script)], capture_output=True, text=True,
                            timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
