"""The built wheel, installed into a fresh virtualenv, is one ``petal`` package: no top-level ``cli``,
``engine`` or ``pipeline`` module, so an unrelated ``pipeline`` package on the path (an Airflow DAG
folder's, say) does not shadow petal's."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO, SAMPLE_DATA


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding only the petal wheel; the test environment's site-packages lends it torch & co."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # NOTE: a copy, so the build leaves no build/ or egg-info in the repository
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info",
                                                                "__pycache__", ".*_cache", ".hypothesis"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(root / "dist"), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = (root / "dist").glob("petal-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    # NOTE: a plain path line, not a site dir: the test environment's .pth files (petal's editable
    # install among them) are not run, so `petal` can only come from the wheel.
    lent = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    (purelib / "zz_test_env.pth").write_text("".join(p + "\n" for p in sorted(lent)))
    return venv


@pytest.mark.slow
def test_wheel_installs_one_petal_package(wheel_venv: Path):
    purelib = next((wheel_venv / "lib").glob("python*/site-packages"))
    top = {p.name for p in purelib.iterdir() if not p.name.endswith((".dist-info", ".pth")) and p.name != "__pycache__"}
    assert top == {"petal"}, top
    assert {p.name for p in (purelib / "petal").iterdir() if p.is_dir() and p.name != "__pycache__"} == \
        {"cli", "engine", "pipeline", "bench"}


@pytest.mark.slow
def test_petal_index_next_to_another_pipeline_package(wheel_venv: Path, tmp_path: Path):
    dags = tmp_path / "dags"
    (dags / "pipeline").mkdir(parents=True)
    (dags / "pipeline" / "__init__.py").write_text('"""Somebody else\'s pipeline package (no __version__)."""\n')
    (dags / "cli.py").write_text("raise ImportError('not petal')\n")
    env = {**os.environ, "PYTHONPATH": str(dags)}
    env.pop("PYTHONHOME", None)
    petal = wheel_venv / "bin" / "petal"
    where = subprocess.run([str(wheel_venv / "bin" / "python"), "-c", "import petal, pipeline; "
                            "print(petal.__file__); print(pipeline.__file__)"], env=env, capture_output=True,
                           text=True, cwd=tmp_path, check=True, timeout=300).stdout.split()
    assert str(wheel_venv) in where[0] and where[1] == str(dags / "pipeline" / "__init__.py")
    # NOTE: 16 rows of the sample data: what is checked is the package the wheel installs, not how much it embeds
    import pyarrow.parquet as pq

    docs = tmp_path / "data" / "docs.parquet"
    docs.parent.mkdir()
    pq.write_table(pq.read_table(SAMPLE_DATA / "shard-000.parquet").slice(0, 16), docs)
    out = tmp_path / "idx"
    done = subprocess.run([str(petal), "index", str(docs), "--out", str(out), "-q"], env=env,
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "petal index: success" in done.stderr.strip().splitlines()[-1]
    found = subprocess.run([str(petal), "query", str(out), "how do glaciers move", "-k", "3", "--json"], env=env,
                           capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert found.returncode == 0 and '"hits"' in found.stdout, found.stderr[-3000:]
