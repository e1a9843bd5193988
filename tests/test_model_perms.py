"""A model FILE petal may not read (mode 000 inside a readable model directory) is 66 naming the file in every
command that loads the model (``petal embed``, ``query``, ``index``, ``serve``), as any other file petal reads and is
denied: no bad model (78). Before: the JSON files (``config.json``, ``modules.json``, ``1_Pooling/config.json``...)
were read through the engine's model-error wrapper and said "cannot read ...: [Errno 13] Permission denied" with
exit 78 (configuration error). A damaged model file stays 78.

Real ``petal`` processes (forked from a preloaded interpreter: tests/_perms_shared.py) without the capabilities that
bypass file modes (dropped when run as root, as ``setpriv`` did), real chmod-000 files in a copy of the packaged
MiniLM, a real ``petal index`` built with it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import _perms_shared as perms
from tests.test_serve_perms import closed, denial_is_real  # noqa: F401 (a fixture)

# config.json, modules.json and 1_Pooling/config.json were 78; the weights and the tokenizer are read by libraries
# that wrap a denied open in their own errors
FILES = ("config.json", "modules.json", "1_Pooling/config.json", "sentence_bert_config.json", "model.safetensors",
         "tokenizer.json")
COMMANDS = ("embed", "query", "index", "serve", "serve-model")
START_S = 120  # each case fails before the server listens; a server that starts instead is stopped here
NO_FAKE = {"PETAL_TEST_FAKE_ENGINE": None}  # petal's own engine: the model's files read as petal reads them


@pytest.fixture(scope="module")
def built(tmp_path_factory, minilm_dir: Path) -> dict[str, Path]:
    """A copy of the packaged model (its files petal may be denied) and an index ``petal index`` built with it."""
    root = tmp_path_factory.mktemp("model-perms")
    model = root / "model"
    shutil.copytree(minilm_dir, model)
    for path in (model, *model.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    pq.write_table(pa.table({"id": [1, 2], "text": ["glaciers move", "vector search"]}), root / "docs.parquet")
    proc = perms.petal(["index", root / "docs.parquet", "--out", root / "out", "--model", model, "-q"],
                       env=NO_FAKE, unprivileged=False)
    assert proc.rc == 0, proc.stderr[-3000:]
    return {"root": root, "model": model, "out": root / "out"}


def run(built: dict[str, Path], command: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    model, out = str(built["model"]), str(built["out"])
    argv = {"embed": ["embed", "--model", model, "--stdin", "--output", str(tmp_path / "e.npy")],
            "query": ["query", out, "glaciers"],
            "index": ["index", str(built["root"] / "docs.parquet"), "--out", str(tmp_path / "out"), "--model", model,
                      "-q"],
            "serve": ["serve", "--port", "0", "--log-level", "warning", out],
            "serve-model": ["serve", "--port", "0", "--log-level", "warning", "--model", model]}[command]
    try:
        done = perms.petal(argv, env=NO_FAKE, stdin=b"hello\n", timeout=START_S)
    except TimeoutError as exc:  # petal serve started: the error was not seen
        raise AssertionError(f"petal {command} ran instead of refusing: {exc}") from None
    return subprocess.CompletedProcess(["petal", *argv], done.rc, done.stdout, done.stderr)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", FILES)
def test_a_model_file_petal_may_not_read_is_66_naming_it(built, denial_is_real, tmp_path, command, name):  # noqa: F811
    if command.startswith("serve"):
        pytest.importorskip("starlette")
        pytest.importorskip("uvicorn")
    path = built["model"] / name
    with closed(path):
        proc = run(built, command, tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 66, (proc.returncode, proc.stderr[-2000:])
    assert last.startswith("petal: error: ") and str(path) in last and "may not read it (permission denied)" in last, \
        last


@pytest.mark.parametrize("command", ("embed", "query"))
def test_a_damaged_model_file_stays_78(built, tmp_path, command):
    """The other side of the rule: a file petal may read but cannot use is the model's fault (78), still."""
    path = built["model"] / "modules.json"
    kept = path.read_bytes()
    path.write_text("{not json")
    try:
        proc = run(built, command, tmp_path)
    finally:
        path.write_bytes(kept)
    assert proc.returncode == 78, (proc.returncode, proc.stderr[-2000:])
    assert str(path) in proc.stderr.strip().splitlines()[-1]
