"""The installed ``petal`` is a typed package (PEP 561 ``py.typed``): mypy checks code that imports it against
petal's annotations (a search's ``list[list[petal.Hit]]`` assigned to an ``int`` is an error), where before it
said "module is installed, but missing library stubs or py.typed marker" and took every name as ``Any``."""

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
