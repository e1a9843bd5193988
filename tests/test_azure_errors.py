"""``abfs://`` / ``abfss://`` errors by the exit-code contract: Azure's refusals 78 advising Azure's credentials, a
chain with no usable credentials 78 naming what to set, a 503 retried then 74; and an HTTP status is read only as a
client prints one, never from a port or a shard's name. pyarrow's real ``AzureFileSystem`` against a fake endpoint on
loopback (``tests/azure_endpoint.py``); a mid-read 503 through a filesystem raising Arrow's own Azure message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs

from petal.pipeline.config import ReadConfig
from petal.pipeline.ingest.parquet import ReadStats, inspect_shard, read_rows
from petal.pipeline.ingest.remote import RemotePath, storage_error
from petal.pipeline.reliability.errors import ConfigError, PetalError, PetalIOError
from tests.azure_endpoint import azure_endpoint
from tests.fake_cli import invoke
from tests.fake_engine import make_fake_model_dir

pytest.importorskip("pyarrow._azurefs")

# Arrow's message for a blob read the service throttled (what the fake endpoint's 503 gives, with its request ID)
AZURE_503 = ("GetProperties failed for 'http://127.0.0.1:18403/acct/cont/dir/part-00403.parquet'. Cannot initialise an "
             "ObjectInputFile without knowing the file size. Azure Error: [ServerBusy] 503 The server is busy.\n\n"
             "Request ID: 00000000-0000-0000-0000-000000000000")


@pytest.fixture(scope="module")
def fake_model(tmp_path_factory) -> Path:
    return make_fake_model_dir(tmp_path_factory.mktemp("model"))


def index(source: str, fake_model: Path, tmp_path: Path, env: dict[str, str] | None = None):
    return invoke(["index", source, "--out", str(tmp_path / "out"), "--model", str(fake_model), "-q"],
                  env={**(env or {}), "PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log.jsonl")})


@pytest.mark.parametrize(("status", "code", "said"), [
    (403, "AuthorizationPermissionMismatch", "access denied"),
    (401, "InvalidAuthenticationInfo", "not authenticated"),
])
def test_an_azure_refusal_is_78_advising_azure_credentials(fake_model, tmp_path, status: int, code: str, said: str):
    """Before: 'for S3: AWS_ACCESS_KEY_ID ...' or the storage's standard chain: no word of Azure's."""
    with azure_endpoint(status, code) as endpoint:
        result = index(endpoint.uri("cont/dir/"), fake_model, tmp_path)
    last = result.output.strip().splitlines()[-1]
    assert result.exit_code == 78 and f"{said} (" in last and "AZURE_CLIENT_ID" in last, result.output
    assert "Request ID" not in last and "\\n" not in last and "AWS_" not in last, last


def test_a_503_from_a_port_holding_403_is_74_not_access_denied(fake_model, tmp_path):
    """Before: 78 'access denied', as '403' stood anywhere in the message (the endpoint's port 18403)."""
    try:
        server = azure_endpoint(503, "ServerBusy", port=18403)
        endpoint = server.__enter__()
    except OSError:
        pytest.skip("port 18403 is taken")
    try:
        result = index(endpoint.uri("cont/dir/"), fake_model, tmp_path)
    finally:
        server.__exit__(None, None, None)
    last = result.output.strip().splitlines()[-1]
    assert result.exit_code == 74 and "rerun when the storage recovers" in last and "denied" not in last, last


@pytest.mark.parametrize(("message", "exit_code"), [
    (AZURE_503, 74),
    (AZURE_503.replace("[ServerBusy] 503 The server is busy.", "[AuthorizationPermissionMismatch] 403 This request "
                                                                "is not authorized."), 78),
    ("When reading information for key 'dir/part-00403.parquet' in bucket 'b': AWS Error UNKNOWN (HTTP status 503) "
     "during HeadObject operation: No response body.", 74),
    ("When reading information for key 'dir/part-00401.parquet' in bucket 'b': AWS Error UNKNOWN (HTTP status 403) "
     "during HeadObject operation: No response body.", 78),
    ("When reading information for key 'code 400/status 401/part-00400.parquet' in bucket 'b': AWS Error UNKNOWN "
     "(HTTP status 500) during HeadObject operation: No response body.", 74),
])
def test_a_status_is_read_only_where_the_client_prints_one(message: str, exit_code: int):
    """Before: a shard named part-00403.parquet (or port 18403) in a 503's message was 78 'access denied'."""
    error = storage_error("cannot read s3://b/dir/x.parquet", OSError(message))
    assert error.exit_code == exit_code, str(error)


class Throttled(fs.FileSystemHandler):
    """Local files as an Azure container whose reads fail with ``message`` while ``fails`` counts down (-1: ever)."""

    def __init__(self, root: str) -> None:
        self.local = fs.SubTreeFileSystem(root, fs.LocalFileSystem())
        self.message, self.fails = AZURE_503, 0

    def get_type_name(self) -> str:
        return "abfs"

    def normalize_path(self, path: str) -> str:
        return path

    def equals(self, other: object) -> bool:
        return other is self

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def open_input_file(self, path: str):
        if self.fails:
            self.fails -= 1
            raise OSError(self.message)
        return self.local.open_input_file(path)

    open_input_stream = open_input_file

    def _unused(self, *args: object) -> None:
        raise NotImplementedError

    open_output_stream = open_append_stream = create_dir = delete_dir = delete_dir_contents = _unused
    delete_root_dir_contents = delete_file = move = copy_file = _unused


def test_an_azure_503_mid_read_is_retried_then_74_and_a_403_is_78(tmp_path):
    """Before: Azure's errors were no storage error: a 503 reading rows was 65 'corrupt data', never retried."""
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "y"]}), tmp_path / "part-00403.parquet")
    handler = Throttled(str(tmp_path))
    remote = RemotePath(fs.PyFileSystem(handler), "part-00403.parquet", "abfs://acct/cont/part-00403.parquet")
    read, stats = ReadConfig(retry_delay_s=0.0), ReadStats()
    info = inspect_shard(remote, read, stats)
    handler.fails = 2  # throttled twice, then served
    assert [r.ids for r in read_rows(0, info, read, stats)] == [["a", "b"]] and stats.retries == 2
    handler.fails = -1
    with pytest.raises(PetalIOError) as busy:
        list(read_rows(0, info, read, stats))
    assert busy.value.exit_code == 74 and "rerun when the storage recovers" in str(busy.value), str(busy.value)
    handler.message = AZURE_503.replace("[ServerBusy] 503", "[AuthorizationPermissionMismatch] 403")
    with pytest.raises(PetalError) as denied:
        list(read_rows(0, info, read, stats))
    assert isinstance(denied.value, ConfigError) and "AZURE_CLIENT_ID" in str(denied.value), str(denied.value)


@pytest.mark.parametrize("chain", [{}, {"AZURE_CLIENT_SECRET": "x"}])
def test_azure_without_usable_credentials_is_78_naming_what_to_set(fake_model, tmp_path, chain: dict[str, str]):
    """Before: 74 'storage error (Unknown error: ... N5Azure4Core11Credentials23AuthenticationExceptionE: Failed to get
    token from DefaultAzureCredential.\\nSee ... (https://aka.ms/azsdk/cpp/identity/troub); rerun when the storage
    recovers': a C++ type name, a newline, a URL cut short, nothing to set, and a rerun fails the same way."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "IDENTITY_", "MSI_"))}
    env.update(chain, PETAL_TEST_FAKE_ENGINE=str(tmp_path / "log.jsonl"))
    done = subprocess.run([sys.executable, "-m", "tests.fake_cli", "index", "abfss://cont@acct.dfs.core.windows.net/d/",
                           "--out", str(tmp_path / "out"), "--model", str(fake_model), "-q"],
                          env=env, capture_output=True, text=True, timeout=60)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 78, done.stderr
    assert "no credentials (Failed to get token from DefaultAzureCredential)" in last, last
    for setting in ("AZURE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE", "managed identity", "az login"):
        assert setting in last, last
    assert "N5Azure" not in done.stderr and "rerun when" not in last

