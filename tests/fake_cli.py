"""petal's CLI with the tests' fake engine (tests/fake_engine.py) when ``PETAL_TEST_FAKE_ENGINE=LOG`` is set.

``python -m tests.fake_cli index ...`` is ``petal index ...`` whose engine is the deterministic
hash -> vector fake that logs every row it embeds to LOG, so crash and signal tests run real
processes without loading weights. The seam lives here, on the tests' side: petal itself only
takes an engine factory through its API (``petal.index(..., engine_factory=...)``) and the CLI's
``Hooks`` object (click's ``obj``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from petal.cli.common import Hooks
from petal.cli.main import cli
from tests.fake_engine import fake_engine_factory

FAKE_ENGINE_ENV = "PETAL_TEST_FAKE_ENGINE"


def fake_hooks(log: Path | str | None) -> Hooks:
    """Hooks whose engine is the fake, logging to ``log``; for ``CliRunner().invoke(cli, args, obj=...)``."""
    return Hooks(engine_factory=fake_engine_factory(Path(log) if log is not None else None))


def invoke(args: Sequence[str], env: Mapping[str, str | None] | None = None, **kwargs: Any) -> Result:
    """``CliRunner().invoke(cli, args, env=env)``, with the fake engine when ``env`` names its log
    (``PETAL_TEST_FAKE_ENGINE``), as ``python -m tests.fake_cli`` does."""
    log = (env or {}).get(FAKE_ENGINE_ENV)
    return CliRunner().invoke(cli, list(args), env=env, obj=fake_hooks(log) if log else None, **kwargs)


def main(argv: list[str] | None = None) -> None:
    """``petal ARGV``; the fake engine when ``PETAL_TEST_FAKE_ENGINE`` names a log file."""
    log = os.environ.get(FAKE_ENGINE_ENV)
    cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="petal",
             obj=fake_hooks(log) if log else None)  # standalone: ends with sys.exit(exit code)


if __name__ == "__main__":
    main()
