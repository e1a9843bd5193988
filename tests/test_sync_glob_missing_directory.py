"""A glob SOURCE whose directory is not there is a missing SOURCE (66), never an emptied corpus.

``petal index data/a.parquet 'nodir/*.parquet' --sync --max-removed 100%`` exited 0 and removed b's documents: a glob
that matched nothing was taken for a glob over an emptied directory, while a missing directory SOURCE is 66 (README:
a typo or a missing mount is not an empty corpus). Now the glob's directory (its path before the first component
with a wildcard) must be there and list: else 66 naming the glob and the directory, before anything is written. A
glob over an existing directory that holds no shard stays an emptied corpus under ``--sync``
(tests/test_sync_empty_sources.py). Real ``petal index`` processes (the fake engine), real Parquet and FAISS.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from petal.pipeline.index.search import IndexReader
from petal.pipeline.ingest.parquet import resolve_sources
from petal.pipeline.layout import OutputDir
from petal.pipeline.reliability.errors import NoInputError, quote_path
from tests._perms_shared import petal
from tests.fake_engine import make_fake_model_dir
from tests.test_reliability import Job, write_shards


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def test_sync_with_a_glob_under_a_missing_directory_is_66_and_removes_nothing(tmp_path, fake_model):
    write_shards(tmp_path / "data", names="ab")
    job = Job(tmp_path, fake_model)
    assert job.run().rc == 0
    live = OutputDir(job.out).current_version()
    versions = sorted(p.name for p in (job.out / "versions").iterdir())
    job.data = job.data / "a.parquet"
    glob = f"{tmp_path}/nodir/*.parquet"
    result = job.run(glob, "--sync", "--max-removed", "100%")
    assert result.rc == 66, result.stderr  # was 0, b's 12 documents removed
    said = f"glob {quote_path(glob)} matches no files: its directory {quote_path(tmp_path / 'nodir')} does not exist"
    assert said in result.last_line, result.stderr
    assert OutputDir(job.out).current_version() == live
    assert sorted(p.name for p in (job.out / "versions").iterdir()) == versions  # nothing written
    assert IndexReader(job.out).index.ntotal == 24
    additive = job.run(glob)  # without --sync: 66 as before, naming the directory now
    assert additive.rc == 66 and "its directory" in additive.last_line, additive.stderr


@pytest.fixture
def tree(tmp_path) -> Path:
    write_shards(tmp_path / "data", names="a")
    (tmp_path / "empty").mkdir()
    return tmp_path


@pytest.mark.parametrize(("glob", "directory", "what"), [
    ("nodir/*.parquet", "nodir", "does not exist"),
    ("nodir/**/*.parquet", "nodir", "does not exist"),
    ("nodir/sub*/x.parquet", "nodir", "does not exist"),
    ("data/nosub/*.parquet", "data/nosub", "does not exist"),
    ("data/a.parquet/*.parquet", "data/a.parquet", "is not a directory"),
    ("data/a.parquet/sub/*.parquet", "data/a.parquet/sub", "is not a directory"),
])
@pytest.mark.parametrize("empty_ok", [True, False])
def test_a_glob_whose_directory_is_not_there_is_no_input_in_every_run(tree, glob, directory, what, empty_ok):
    with pytest.raises(NoInputError) as raised:
        resolve_sources([f"{tree}/{glob}"], empty_ok=empty_ok)
    assert str(raised.value) == f"glob {quote_path(f'{tree}/{glob}')} matches no files: its directory " \
                                f"{quote_path(tree / directory)} {what}"


@pytest.mark.parametrize("glob", ["empty/*.parquet", "empty/**/*.parquet", "data/*.parqeut", "dat*/none/*.parquet"])
def test_a_glob_over_an_existing_directory_that_holds_no_shard_stays_an_emptied_corpus_under_sync(tree, glob):
    assert resolve_sources([f"{tree}/{glob}"], empty_ok=True) == []
    with pytest.raises(NoInputError, match=r"matches no files$"):  # without --sync: no input, as before
        resolve_sources([f"{tree}/{glob}"])


def test_sync_with_a_glob_under_a_directory_petal_may_not_list_is_66(tmp_path, fake_model):
    """A directory petal may enter but not list (mode 111): the glob matched nothing, silently (an emptied corpus
    under --sync). Unprivileged (root without the capabilities that bypass file modes)."""
    write_shards(tmp_path / "data", names="ab")
    job = Job(tmp_path, fake_model)
    assert job.run().rc == 0
    live = OutputDir(job.out).current_version()
    denied = tmp_path / "denied"
    denied.mkdir()
    denied.chmod(0o111)
    try:
        result = petal([*job.argv("--sync", "--max-removed", "100%"), f"{denied}/*.parquet"], job.env())
    finally:
        denied.chmod(0o755)
    assert result.rc == 66, result.stderr
    assert f"its directory {quote_path(denied)}: cannot be read (Permission denied)" in result.last_line
    assert OutputDir(job.out).current_version() == live
