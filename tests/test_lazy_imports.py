"""Lazy imports (issue 14, item 2): help, version, info, verify and every usage error start without
torch or FAISS; each command imports the heavy libraries it needs only; nothing imports benchmark
code or transformers at run time."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from tests.conftest import REPO

HEAVY = ("torch", "faiss", "pyarrow", "tokenizers", "safetensors", "transformers", "sentence_transformers",
         "petal.bench", "pandas")  # pandas: pyarrow's pa.array() imports it when installed (0.25-0.4 s)
# Runs one CLI invocation in a fresh interpreter, then reports its exit code and the heavy modules loaded.
RUNNER = f"""
import json, sys
from petal.cli.main import cli
code = 0
try:
    cli.main(json.loads(sys.argv[1]), prog_name="petal")
except SystemExit as exc:
    code = exc.code
loaded = [m for m in {HEAVY!r} if m in sys.modules]
with open(sys.argv[2], "w") as fh:
    json.dump({{"code": code, "loaded": loaded}}, fh)
"""


def run(argv: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> tuple[int, set[str]]:
    result = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(argv), str(result)], capture_output=True,
                          text=True, cwd=REPO, timeout=300, env={**os.environ, **(env or {})})
    assert result.is_file(), proc.stderr[-3000:]
    found = json.loads(result.read_text())
    return found["code"], set(found["loaded"])


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    """A small real index (fake vectors under MiniLM's identity, so ``petal query`` runs MiniLM)."""
    from petal.engine.loader import default_model_dir

    root = tmp_path_factory.mktemp("lazy")
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["glaciers flow downhill", "bread needs yeast", "lava"]}),
                   root / "docs.parquet")
    out = root / "out"
    result = CliRunner().invoke(cli, ["index", str(root / "docs.parquet"), "--out", str(out), "-q", "--model",
                                      str(default_model_dir())], env={"PETAL_TEST_FAKE_ENGINE": str(root / "log")})
    assert result.exit_code == 0, result.output
    return out


LIGHT = [
    (["--help"], 0), (["--version"], 0), ([], 2), (["nosuch"], 2),
    *[([command, "--help"], 0) for command in ("index", "query", "embed", "info", "verify", "rebuild", "serve",
                                               "bench", "versions", "rollback")],
    (["bench", "startup", "--help"], 0), (["serve", "--bogus"], 2),
    (["index", "--bogus"], 2), (["index", "data"], 2), (["query"], 2), (["query", "OUT", "x", "-k", "0"], 2),
    (["embed"], 2), (["embed", "--device", "tpu", "x"], 2), (["embed", "--dim", "0", "x"], 2), (["info"], 2),
    (["info", "--bogus", "x"], 2), (["verify"], 2), (["verify", "OUT", "--bogus"], 2), (["rebuild"], 2),
    (["bench", "startup", "--runs", "0"], 2),
    *[(["bench", command, "--shape", "pplx-embed-6b"], 2) for command in ("gpu", "e2e", "serve", "startup")],
    # flags the command can judge before anything loads: no index opened, no model, no Arrow
    (["query", "OUT"], 2), (["query", "OUT", "x", "--vector-file", "q.npy"], 2),
    (["query", "OUT", "--stdin", "--vector-file", "q.npy"], 2), (["query", "OUT", "x", "--where", "lang ==="], 2),
    (["query", "OUT", "x", "--where", ""], 2),  # NOTE: an empty expression was judged after the model loaded
    # an index that is not there (a typo): 78 before Arrow, FAISS or a model loads
    (["query", "no-such-index", "x"], 78), (["query", "no-such-index", "x", "--where", "lang = 'en'"], 78),
    (["info", "no-such-index"], 78), (["verify", "no-such-index"], 78), (["verify", "no-such-index", "--json"], 78),
    (["versions"], 2), (["rollback"], 2), (["rollback", "OUT", "latest"], 2), (["versions", "no-such-index"], 78),
    (["rollback", "no-such-index"], 78),
    # an input file that is not there: no input (66), still before anything heavy loads
    (["query", "OUT", "--vector-file", "missing.npy"], 66), (["query", "OUT", "--vector-file", "."], 66),
    (["embed", "--input", "missing.txt"], 66), (["embed", "--input", "missing.parquet"], 66),
    (["embed", "--max-length", "0", "x"], 2), (["embed", "--max-length", "1", "x"], 2),
    (["embed", "--quantize", "binary", "--output-dtype", "float16", "x"], 2),
    (["embed", "--output", "x.txt", "x"], 2), (["embed", "--calibration", "OUT", "x"], 2),
    (["index", "data", "--out", "o", "--index-memory", "lots"], 2),
    (["index", "data", "--out", "o", "--max-removed", "some"], 2), (["index", "data", "--out", "o", "--max-bad-rows",
                                                                     "x"], 2),
    (["index", "data", "--out", "o", "--max-length", "1"], 2),
    (["index", "data", "--out", "o", "--keep-columns", "a,a"], 2),
    (["index", "data", "--out", "o", "--keep-columns", ""], 2),
    (["index", "data", "--out", "o", "--output-dtype", "float16", "--quantize", "int8"], 2),
    (["rebuild", "OUT", "--index-memory", "lots"], 2),
    # --device cpu with what the CPU engine refuses: judged from the flags (they imported torch, petal serve's
    # load thread ended in a traceback, exit 1)
    (["embed", "--device", "cpu", "--dtype", "float16", "x"], 2),
    (["embed", "--device", "cpu", "--attention", "flashinfer", "x"], 2),
    (["query", "OUT", "x", "--device", "cpu", "--attention", "torch"], 2),
    (["index", "data", "--out", "o", "--device", "cpu", "--dtype", "float16"], 2),
    (["serve", "--model", "m", "--device", "cpu", "--dtype", "float16"], 2),
    (["serve", "--model", "m", "--device", "cpu", "--attention", "flashinfer"], 2),
]


@pytest.mark.parametrize(("argv", "code"), LIGHT, ids=[" ".join(a) or "no-args" for a, _ in LIGHT])
def test_help_version_and_usage_errors_import_nothing_heavy(argv, code, tmp_path):
    got, loaded = run(argv, tmp_path)
    assert got == code
    assert not loaded, f"petal {' '.join(argv)} imported {sorted(loaded)}"


def test_info_and_verify_read_the_manifest_without_torch_or_faiss(index_dir, tmp_path):
    # NOTE: petal info reads ids.parquet's footer with pyarrow, as opening does (pipeline/index/open_checks.py: a
    # version every query refused with 65 was shown exit 0); an index that is not there loads nothing heavy
    for argv in (["info", str(index_dir)], ["info", str(index_dir), "--json"], ["info", str(tmp_path / "missing")]):
        code, loaded = run(argv, tmp_path)
        assert code == (78 if "missing" in argv[1] else 0)
        assert not loaded - ({"pyarrow"} if code == 0 else set()), f"petal {' '.join(argv)} imported {sorted(loaded)}"
    # petal verify reads the index as opening does (FAISS, the ids' footer) once every byte matched; no model
    code, loaded = run(["verify", str(index_dir)], tmp_path)
    assert code == 0 and not loaded - {"faiss", "pyarrow"}, loaded


def test_versions_and_rollback_read_manifests_without_anything_heavy(index_dir, tmp_path):
    live = (index_dir / "CURRENT").read_text().strip()
    for argv in (["versions", str(index_dir)], ["versions", str(index_dir), "--json"],
                 ["rollback", str(index_dir), live]):  # live already: nothing changed
        code, loaded = run(argv, tmp_path)
        assert code == 0 and not loaded, f"petal {' '.join(argv)}: {code}, imported {sorted(loaded)}"


def test_the_api_versions_and_rollback_import_nothing_heavy(index_dir):
    """``petal.versions``/``petal.rollback`` (which ``petal rollback`` calls) read manifests only, as the commands."""
    live = (index_dir / "CURRENT").read_text().strip()
    code = (f"import sys, petal; out = sys.argv[1]; assert petal.versions(out)[0].live; "
            f"assert not petal.rollback(out, {live!r}).changed; print([m for m in {HEAVY!r} if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code, str(index_dir)], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-3000:]


def test_each_command_imports_only_what_it_needs(index_dir, tmp_path):
    code, loaded = run(["embed", "a query"], tmp_path)
    assert code == 0 and {"torch", "tokenizers"} <= loaded
    # petal reads safetensors files itself (engine/models/safetensors_header.py, stream.py)
    assert not loaded & {"faiss", "pyarrow", "safetensors", "transformers", "sentence_transformers", "petal.bench",
                         "pandas"}, loaded
    code, loaded = run(["query", str(index_dir), "ice", "-k", "1"], tmp_path)
    assert code == 0 and {"torch", "faiss", "pyarrow", "tokenizers"} <= loaded
    assert not loaded & {"transformers", "sentence_transformers", "petal.bench", "pandas"}, loaded
    import numpy as np

    np.save(tmp_path / "q.npy", np.ones((1, 384), np.float32))
    code, loaded = run(["query", str(index_dir), "--vector-file", str(tmp_path / "q.npy"), "-k", "1"], tmp_path)
    assert code == 0 and {"faiss", "pyarrow"} <= loaded  # by vector: no model, so neither torch nor a tokenizer
    assert not loaded & {"torch", "tokenizers", "safetensors", "transformers", "petal.bench", "pandas"}, loaded
    code, loaded = run(["rebuild", str(index_dir), "--index-factory", "Flat"], tmp_path)
    assert code == 0 and "faiss" in loaded
    assert not loaded & {"torch", "tokenizers", "safetensors", "transformers", "petal.bench"}, loaded
    # an index of precomputed vectors: no model, so neither torch nor a tokenizer
    table = pa.table({"id": [1, 2, 3], "emb": pa.FixedSizeListArray.from_arrays(pa.array(np.eye(3, 8, dtype=np.float32)
                                                                                           .ravel()), 8)})
    pq.write_table(table, tmp_path / "vectors.parquet")
    code, loaded = run(["index", str(tmp_path / "vectors.parquet"), "--out", str(tmp_path / "vout"), "-q",
                        "--vectors-column", "emb", "--index-factory", "Flat"], tmp_path)
    assert code == 0 and {"faiss", "pyarrow"} <= loaded and (tmp_path / "vout" / "CURRENT").is_file()
    assert not loaded & {"torch", "tokenizers", "safetensors", "transformers", "petal.bench"}, loaded


# `petal index` runs refused by what the model's config.json says: judged through the model's torch-free family
# (engine/models/families.py), before torch loads. FAISS judges --index-factory; torch is still not needed.
MODEL_REFUSALS = [
    (["--dim", "1000"], 2, "dim wider than the model"),
    (["--max-length", "100000"], 2, "max-length over the model's limit"),
    (["--index-factory", "Bogus"], 2, "bad index factory"),
    (["--model", "GPT2"], 78, "unsupported architecture"),
]


@pytest.mark.parametrize(("flags", "code"), [c[:2] for c in MODEL_REFUSALS], ids=[c[2] for c in MODEL_REFUSALS])
def test_an_index_run_refused_by_the_models_config_never_imports_torch(flags, code, tmp_path):
    pq.write_table(pa.table({"id": [1, 2], "text": ["glaciers flow downhill", "bread needs yeast"]}),
                   tmp_path / "docs.parquet")
    (tmp_path / "GPT2").mkdir()
    (tmp_path / "GPT2" / "config.json").write_text(json.dumps({"architectures": ["GPT2Model"], "model_type": "gpt2"}))
    flags = [str(tmp_path / f) if f == "GPT2" else f for f in flags]
    argv = ["index", str(tmp_path / "docs.parquet"), "--out", str(tmp_path / "out"), "-q", *flags]
    got, loaded = run(argv, tmp_path, env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log")})
    assert got == code, argv
    assert "torch" not in loaded, f"petal {' '.join(argv)} imported torch"
    assert not (tmp_path / "out" / "CURRENT").exists()


RUNTIME_DIRS = ("cli", "engine", "pipeline", "petal")


def test_the_bench_commands_shape_choices_are_the_benchmark_shapes():
    """``--shape`` choices equal bench/shapes.py's SHAPES keys (read from its source: tests import no bench code)."""
    from petal.cli.bench import SHAPE_NAMES

    tree = ast.parse((REPO / "bench" / "shapes.py").read_text(encoding="utf-8"))
    [shapes] = [node.value for node in tree.body if isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name) and node.target.id == "SHAPES"]
    assert isinstance(shapes, ast.Dict)
    assert sorted(SHAPE_NAMES) == sorted(ast.literal_eval(key) for key in shapes.keys if key is not None)


def test_no_runtime_module_imports_benchmarks_or_transformers():
    """Module-level imports of the runtime packages never name ``transformers``, ``sentence_transformers``
    or ``petal.bench``; only ``cli/bench.py`` reaches benchmark code, inside its commands."""
    for directory in RUNTIME_DIRS:
        for path in sorted((REPO / directory).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in tree.body:
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                for name in names:
                    root = name.split(".")[0]
                    assert root not in ("transformers", "sentence_transformers"), f"{path}: imports {name}"
                    assert not name.startswith("petal.bench"), f"{path}: imports {name} at module level"
            if path.name != "bench.py" or path.parent.name != "cli":
                text = path.read_text()
                assert "petal.bench" not in text or path.parent.name == "petal", f"{path} names petal.bench"


# Every command and subcommand found by walking the click group (not a fixed list), each asked for help, given
# a flag it does not know, its required arguments left out, an option without its value and a choice or number
# option given a bad one: all before anything heavy loads. One interpreter runs them all, in order, so the first
# invocation that imports a heavy module is the one named.
WALKER = f"""
import contextlib, io, json, sys
import click
from petal.cli.main import cli

def walk(command, path):
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from walk(sub, path + [name])

def invocations(path, command):
    yield path + ["--help"]
    yield path + ["--bogus-flag"]
    if isinstance(command, click.Group) or any(p.required for p in command.params):
        yield path
    for param in command.params:
        if not isinstance(param, click.Option) or param.is_flag or param.count or not param.opts[0].startswith("--"):
            continue
        yield path + [param.opts[0]]  # the value left out
        if isinstance(param.type, (click.Choice, click.types.IntParamType, click.types.FloatParamType)):
            yield path + [param.opts[0], "bogus!"]

seen = []
for path, command in walk(cli, []):
    for argv in invocations(path, command):
        code = 0
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                cli.main(argv, prog_name="petal")
            except SystemExit as exc:
                code = exc.code
        loaded = [m for m in {HEAVY!r} if m in sys.modules]
        seen.append({{"argv": argv, "code": code, "loaded": loaded}})
        if loaded:
            break
    else:
        continue
    break
with open(sys.argv[1], "w") as fh:
    json.dump(seen, fh)
"""


def test_every_command_found_by_walking_the_group_starts_without_anything_heavy(tmp_path):
    """``petal X --help``, a bad flag, missing arguments and bad option values, for every command and subcommand
    the click group holds (``petal bench`` ones included): exit 0 or 2, no torch, FAISS, Arrow, tokenizers,
    transformers or benchmark code imported."""
    result = tmp_path / "walk.json"
    proc = subprocess.run([sys.executable, "-c", WALKER, str(result)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=600)
    assert result.is_file(), proc.stderr[-3000:]
    seen = json.loads(result.read_text())
    commands = {tuple(entry["argv"][:-1]) for entry in seen if entry["argv"][-1:] == ["--help"]}
    assert {("bench", "startup"), ("index",), ("query",), ("info",), ("verify",), ("serve",)} <= commands, commands
    assert len(seen) > 100, len(seen)
    for entry in seen:
        assert not entry["loaded"], f"petal {' '.join(entry['argv'])} imported {entry['loaded']}"
        assert entry["code"] in (0, 2), entry
