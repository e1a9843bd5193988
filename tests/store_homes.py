"""A home for the store damage tests (test_store_damage, test_store_entry_files): DATA with shards ``a`` and ``b``
and OUT after a first ``petal index`` with the fake engine, made once per module, and put back as it was after each
test that damages it. NOTE: the store records the shards' absolute paths, so DATA stays where the first run read it
(the home is restored in place, not copied elsewhere)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests import forkrun
from tests.fake_engine import make_fake_model_dir


class HomeJob:
    """``petal`` runs over a home (DATA, OUT) in forked processes with the fake engine, each logging what it embeds
    to ``fake-N.jsonl`` (N: the run's count). ``command(argv)``: the words of a run (default: ``petal index DATA``)."""

    def __init__(self, root: Path, model: Path) -> None:
        self.root, self.model, self.data, self.out = root, model, root / "data", root / "out"
        self.count = 0

    def command(self, argv: tuple[str, ...]) -> list[str]:
        return list(argv or ("index", str(self.data), "--out", str(self.out), "--model", str(self.model), "-q"))

    def run(self, *argv: str) -> tuple[forkrun.Result, Path]:
        self.count += 1
        log = self.root / f"fake-{self.count}.jsonl"
        result = forkrun.petal(self.command(argv), {"PETAL_TEST_FAKE_ENGINE": str(log)})
        assert "Traceback" not in result.stderr, result.stderr
        return result, log

    def entry_of(self, name: str) -> Path:
        """The store entry of shard ``name`` (``DATA/name.parquet``)."""
        return next(e.parent for e in (self.out / "store" / "shards").glob("*/*/entry.json")
                    if json.loads(e.read_text())["source"]["path"].endswith(f"{name}.parquet"))


def first_run_home(root: Path, write: Callable[[Path, str], None], job_type: Callable[[Path, Path], Any]) -> Path:
    """``root/home`` with DATA (``write`` makes each shard) after a first run of a ``job_type`` job (rc 0); the fake
    model beside it (``root/model``)."""
    home = root / "home"
    (home / "data").mkdir(parents=True)
    for name in "ab":
        write(home / "data", name)
    job = job_type(home, make_fake_model_dir(root / "model"))
    assert job.run()[0].rc == 0
    return home


@contextmanager
def restored(home: Path, spare: Path) -> Iterator[None]:
    """``home`` as it is now again after the block (a copy kept in ``spare``), whatever the block did to it."""
    shutil.copytree(home, spare, symlinks=True)
    try:
        yield
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.copytree(spare, home, symlinks=True)


def home_fixtures(label: str, write: Callable[[Path, str], None], job_type: Callable[[Path, Path], Any]) -> Any:
    """The module's ``pristine`` (the home after its first run, made once) and ``job`` (a ``job_type`` on that home,
    its run count after the first run, the home put back after the test) fixtures: ``pristine, job =
    home_fixtures(...)`` at a test module's top level."""

    @pytest.fixture(scope="module")
    def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
        return first_run_home(tmp_path_factory.mktemp(label), write, job_type)

    @pytest.fixture
    def job(pristine: Path, tmp_path: Path) -> Iterator[Any]:
        with restored(pristine, tmp_path / "copy"):
            made = job_type(pristine, pristine.parent / "model")
            made.count = 1  # fake-1.jsonl is the first run's log
            yield made

    return pristine, job
