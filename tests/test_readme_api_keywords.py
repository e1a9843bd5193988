"""The README's Python API bullets list, for ``petal.index``, ``petal.rebuild``, ``petal.open_index`` and
``petal.verify`` (and ``petal.versions``, ``petal.rollback``), the keywords of the command each is (the flags of ``petal
index``, ``rebuild``, ``query``'s model and search flags, ``verify``, ``versions``, ``rollback``). ``petal.rebuild``'s
left out ``keep_versions`` (``--keep-versions``), which it takes, so a user reading it had no way to bound the
versions a rebuild keeps. Every flag of each command is now named there as its keyword (flags that have no keyword in
the API, such as ``--json``, excepted)."""

from __future__ import annotations

import re

import click
import pytest

from petal.cli.main import cli
from tests.conftest import REPO

# flags that are no keyword of the call: its output (the returned object is it), or query's input and per-search ones
NOT_KEYWORDS = {"as_json", "help", "out", "sources", "texts", "index_path", "stdin", "show_text", "vector_file", "k",
                "where", "quantize_query", "dtype_query"}


def _bullet(readme: str, call: str) -> str:
    start = readme.index(f"- `{call}(")
    end = readme.find("\n- ", start + 1)
    return readme[start:end]


@pytest.mark.parametrize("command, call", [("index", "petal.index"), ("rebuild", "petal.rebuild"),
                                           ("verify", "petal.verify"), ("versions", "petal.versions"),
                                           ("rollback", "petal.rollback")])
def test_every_flag_of_the_command_is_named_in_the_api_bullet(command, call):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    bullet = _bullet(readme, call)
    assert isinstance(cli, click.Group)
    flags = [p.name for p in cli.commands[command].params if isinstance(p, click.Option)]
    keywords = {"no_cuda_graphs": "cuda_graphs"}
    missing = [name for name in flags if name not in NOT_KEYWORDS
               and not re.search(rf"`{keywords.get(name, name)}[`=]", bullet)]
    assert not missing, f"{call}'s README bullet does not name {missing}"
