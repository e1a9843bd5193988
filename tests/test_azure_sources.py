"""``abfs://`` and ``abfss://`` sources on emulated storage accounts (tests/azure_emulation.py: CI has no Azure).

Arrow's AzureFileSystem names an object ``container/path``, without its account, so petal stored
``abfs://cont/dir/a.parquet`` for every account's object of that path: an additive run from a second account
replaced the first one's shard ("1 changed"), and no stored URI could be opened again (no account: ``--full`` was
74, a search's metadata 'unreadable'). A stored URI now keeps the account (``abfs://ACCOUNT.blob.core.windows.net/
cont/dir/a.parquet``, ``abfs://ACCOUNT@HOST:PORT/cont/...`` on another endpoint), whichever way a SOURCE spells it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.index.search import IndexReader
from petal.pipeline.ingest import remote
from tests.azure_emulation import emulate_azure
from tests.fake_cli import invoke
from tests.fake_engine import make_fake_model_dir
from tests.test_hdfs_sources import index, indexed_ids, stored  # the same CLI run and reads

ONE = "abfs://acct1.blob.core.windows.net/cont/dir/a.parquet"
TWO = "abfs://acct2.blob.core.windows.net/cont/dir/a.parquet"


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def accounts(tmp_path, monkeypatch) -> dict[str, Path]:
    """acct1 and acct2 on Azure, acct1 on an emulator's endpoint (another account of that name); each a directory."""
    found = {name: tmp_path / name.replace(":", "_") for name in ("acct1", "acct2", "acct1@127.0.0.1:10000")}
    for root in found.values():
        root.mkdir()
    emulate_azure(monkeypatch, found)
    return found


def put(root: Path, path: str, prefix: str, rows: int) -> list[str]:
    """A blob at ``path`` (``container/...``) of the account stored under ``root``; its ids."""
    ids = [f"{prefix}-{i}" for i in range(rows)]
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "text": [f"{prefix} document {i}" for i in range(rows)],
                             "lang": [prefix] * rows}), target)
    return ids


def read_back(out: Path) -> list[str]:
    """The ids of every vector's record as a search reads it (no SOURCE: the stored URI alone)."""
    reader = IndexReader(out)
    hits = [row[0] for row in reader.search(reader.index.reconstruct_n(0, reader.ntotal), 1)]
    records = reader.records(hits)
    assert reader.missing_shards == {}, reader.missing_shards
    return sorted(r["id"] for r in records if r is not None)


@pytest.mark.parametrize("mode", ["additive", "--sync", "--full"])
def test_two_accounts_with_the_same_container_and_path_are_two_shards(accounts, fake_model, tmp_path, mode):
    """Before: both were abfs://cont/dir/a.parquet; the second run said '1 changed' and replaced acct1's rows."""
    one = put(accounts["acct1"], "cont/dir/a.parquet", "one", 4)
    two = put(accounts["acct2"], "cont/dir/a.parquet", "two", 5)
    out, log = tmp_path / "out", tmp_path / "log"
    first = index(out, fake_model, log, "abfs://cont@acct1.dfs.core.windows.net/dir/")
    assert first.exit_code == 0, first.output
    second = ["abfs://cont@acct2.dfs.core.windows.net/dir/"]
    if mode != "additive":
        second = ["abfs://cont@acct1.dfs.core.windows.net/dir/", *second, mode]
    result = index(out, fake_model, log, *second)
    assert result.exit_code == 0, result.output
    assert stored(out) == [ONE, TWO]
    assert indexed_ids(out) == sorted(one + two) == read_back(out)
    np.save(tmp_path / "q.npy", IndexReader(out).index.reconstruct(0))  # NOTE: query's model is not the fake engine
    shown = invoke(["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "9", "--json", "--show-text"])
    assert shown.exit_code == 0, shown.output
    hits = json.loads(shown.stdout)["hits"]
    assert sorted(h["id"] for h in hits) == sorted(one + two), hits
    assert all(h["text"] == f"{h['id'].split('-')[0]} document {h['id'].split('-')[1]}" for h in hits), hits
    info = invoke(["info", str(out)])
    assert info.exit_code == 0 and ONE in info.stdout and TWO in info.stdout, info.output


def test_every_spelling_of_one_account_is_one_shard(accounts, fake_model, tmp_path):
    """Before: abfs:// and abfss:// (one filesystem to Arrow, TLS either way) were two shards, and so were the
    account's spellings (its container as user info, the account as user info, the account's blob host)."""
    ids = put(accounts["acct1"], "cont/dir/a.parquet", "one", 3)
    out, log = tmp_path / "out", tmp_path / "log"
    spellings = ["abfss://cont@acct1.dfs.core.windows.net/dir/", "abfs://cont@acct1.dfs.core.windows.net/dir",
                 "abfs://acct1@cont/dir/", "abfss://acct1@cont/dir", "abfs://acct1.blob.core.windows.net/cont/dir/",
                 "abfs://cont@ACCT1.dfs.core.windows.net/dir/", "ABFSS://cont@acct1.dfs.core.windows.net/dir/a.parquet",
                 "abfs://acct1:c2VjcmV0@cont/dir/", "abfss://cont@acct1.dfs.core.windows.net/*/a.parquet"]
    for spelling in spellings:
        result = index(out, fake_model, log, spelling)
        assert result.exit_code == 0, (spelling, result.output)
        assert stored(out) == [ONE], spelling
    assert indexed_ids(out) == ids
    both = index(tmp_path / "both", fake_model, log, *spellings[:3])
    assert both.exit_code == 0, both.output
    assert stored(tmp_path / "both") == [ONE] and indexed_ids(tmp_path / "both") == ids


def test_an_emulators_account_is_its_own_and_its_stored_uri_opens_it(accounts, fake_model, tmp_path):
    """acct1 on 127.0.0.1:10000 (Azurite) is not Azure's acct1: two shards, each read back from its own account by
    a search (no SOURCE) and by --full."""
    one = put(accounts["acct1"], "cont/dir/a.parquet", "one", 2)
    local = put(accounts["acct1@127.0.0.1:10000"], "cont/dir/a.parquet", "local", 3)
    more = put(accounts["acct2"], "other/b.parquet", "more", 2)
    out, log = tmp_path / "out", tmp_path / "log"
    result = index(out, fake_model, log, "abfs://acct1@cont/dir/", "abfs://acct1@127.0.0.1:10000/cont/dir/")
    assert result.exit_code == 0, result.output
    emulated = "abfs://acct1@127.0.0.1:10000/cont/dir/a.parquet"
    assert stored(out) == sorted([emulated, ONE])
    full = index(out, fake_model, log, "abfss://other@acct2.dfs.core.windows.net/", "--full")
    assert full.exit_code == 0, full.output
    assert stored(out) == sorted([emulated, ONE, "abfs://acct2.blob.core.windows.net/other/b.parquet"])
    assert indexed_ids(out) == sorted(one + local + more) == read_back(out)
    from pyarrow import fs

    for uri in stored(out):  # NOTE: the stored URI alone reaches its account (fs.FileSystem: the emulation's)
        filesystem, path = fs.FileSystem.from_uri(uri)
        assert filesystem.get_file_info(path).type == fs.FileType.File, uri


def test_messages_keep_the_container_and_hide_only_a_password(accounts, fake_model, tmp_path):
    """Before: 'source abfs://acct1.dfs.core.windows.net/nothing/ does not exist': the container (taken for user
    info) left out, and every 'in' of the message masked for a container named 'in'."""
    put(accounts["acct1"], "in/dir/a.parquet", "one", 2)
    out, log = tmp_path / "out", tmp_path / "log"
    missing = index(out, fake_model, log, "abfs://in@acct1.dfs.core.windows.net/nothing/")
    assert missing.exit_code == 66, missing.output
    assert "source abfs://in@acct1.dfs.core.windows.net/nothing/ does not exist" in missing.output, missing.output
    assert "***" not in missing.output, missing.output
    secret = index(out, fake_model, log, "abfs://acct1:c2VjcmV0@in/nothing/?enable_tls=false")
    assert secret.exit_code == 66 and "c2VjcmV0" not in secret.output and "enable_tls" not in secret.output
    assert "abfs://acct1@in/nothing/ does not exist" in secret.output, secret.output
    assert remote.display_uri("abfs://acct1:ab/cd@in/x") == "abfs://acct1@in/x"
    info = invoke(["index", "abfs://in@acct1.dfs.core.windows.net/dir", "--out", str(out), "--model", str(fake_model),
                   "-q", "--json-report", str(tmp_path / "report.json")], env={"PETAL_TEST_FAKE_ENGINE": str(log)})
    assert info.exit_code == 0, info.output
    assert "abfs://acct1.blob.core.windows.net/in/dir/a.parquet" in (tmp_path / "report.json").read_text()


def older_petal(monkeypatch: pytest.MonkeyPatch) -> None:
    """``remote.stored_root`` as petal had it: ``scheme://`` for a filesystem whose paths are not absolute."""
    monkeypatch.setattr(remote, "stored_root", lambda source, path: f"{remote.scheme_of(source)}://")


def test_a_shard_an_older_petal_stored_without_its_account_is_78_then_replaced_by_sync(accounts, fake_model,
                                                                                     tmp_path, monkeypatch):
    """An older petal stored acct1's cont/dir/a.parquet as abfs://cont/dir/a.parquet. Named again with its account
    it is another URI (its rows twice), and from another account it was taken for that shard; --full could not open
    it (74 'AzureOptions doesn't contain a valid account name', a rerun fails the same way). Now 78 saying to pass
    --sync, which replaces it."""
    ids = put(accounts["acct1"], "cont/dir/a.parquet", "one", 4)
    two = put(accounts["acct2"], "cont/dir/a.parquet", "two", 3)
    more = put(accounts["acct1"], "cont/more/b.parquet", "more", 2)
    out, log = tmp_path / "out", tmp_path / "log"
    with monkeypatch.context() as patch:
        older_petal(patch)
        assert index(out, fake_model, log, "abfss://cont@acct1.dfs.core.windows.net/dir").exit_code == 0
    assert stored(out) == ["abfss://cont/dir/a.parquet"]
    kept = index(out, fake_model, log, "abfs://acct1@cont/more")  # the old record carried forward: still unknown
    assert kept.exit_code == 0, kept.output
    for source in ("abfs://acct1@cont/dir", "abfs://acct2@cont/dir"):
        again = index(out, fake_model, log, source)
        assert again.exit_code == 78, again.output
        last = again.output.strip().splitlines()[-1]
        assert "a.parquet is in the index as abfss://cont/dir/a.parquet: an older petal recorded Azure shards " \
               "without their storage account" in last, last
        assert "--sync" in last and "twice" in last, last
    full = index(out, fake_model, log, "abfs://acct1@cont/more", "--full")
    assert full.exit_code == 78, full.output
    last = full.output.strip().splitlines()[-1]
    assert "recorded by an older petal as abfss://cont/dir/a.parquet, without its Azure storage account" in last, last
    assert "--sync" in last and "storage error" not in last, last
    assert len(indexed_ids(out)) == 6
    synced = index(out, fake_model, log, "abfs://acct1@cont/dir", "abfs://acct1@cont/more", "abfs://acct2@cont/dir",
                   "--sync")
    assert synced.exit_code == 0, synced.output
    assert stored(out) == sorted(["abfs://acct1.blob.core.windows.net/cont/more/b.parquet", ONE, TWO])
    assert indexed_ids(out) == sorted(ids + two + more) == read_back(out)
