"""Azure storage accounts emulated on local directories, for tests: Arrow's ``AzureFileSystem`` needs an account
on Azure or an emulator (Azurite), which CI does not have.

``emulate_azure(monkeypatch, {"acct1": dir1, "acct2@127.0.0.1:10000": dir2})`` makes
``pyarrow.fs.FileSystem.from_uri("abfs://cont@acct1.dfs.core.windows.net/dir/x")`` return a ``PyFileSystem`` over
``dir1`` (each container a directory in it) and the path ``cont/dir/x``. An account is named as Arrow reaches it:
``ACCOUNT`` on Azure's own endpoint (``.blob.core.windows.net``; its DNS name, so in any case), ``ACCOUNT@HOST:PORT``
on another endpoint (an emulator's account, in its own case). An account not listed fails as an unknown host does
(``OSError``). Every other URI goes to pyarrow's own ``from_uri``.

Faithful to Arrow (arrow/cpp/src/arrow/filesystem/azurefs.cc): the URI is parsed by Arrow itself
(``AzureOptions::FromUri``: every spelling of an account, ``abfs://`` and ``abfss://`` alike, the query's
``blob_storage_authority``, and its refusals: no account, an unknown query parameter), and only the filesystem it
returns is replaced; paths are ``container/path``, never with a leading ``/`` (``Path cannot start with a
separator``); a ``FileSelector`` listing names entries by ``container/path``. The substitution is of the
``pyarrow.fs.FileSystem`` attribute, which petal reaches as ``fs.FileSystem.from_uri`` at call time, so it applies
to a CLI run in-process (``tests.fake_cli.invoke``). The handler pickles (by its root directory), as a filesystem
sent to a worker does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pyarrow import fs

REAL_FILESYSTEM = fs.FileSystem
AZURE_BLOB = ".blob.core.windows.net"  # Arrow's default blob_storage_authority


class AccountHandler(fs.FileSystemHandler):
    """One storage account's containers: Arrow's Azure paths (``container/path``) over the local directory ``root``."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._local = fs.SubTreeFileSystem(root, fs.LocalFileSystem())

    def __reduce__(self) -> tuple[Any, ...]:
        return AccountHandler, (self.root,)

    def _in_account(self, path: str) -> str:
        if path.startswith("/"):  # Arrow's AzureLocation::FromString
            raise ValueError(f"Path cannot start with a separator ('{path}')")
        return path.rstrip("/")

    def _info(self, path: str, local: fs.FileInfo) -> fs.FileInfo:
        return fs.FileInfo(path, local.type, mtime_ns=local.mtime_ns, size=local.size)

    def get_type_name(self) -> str:
        return "abfs"

    def normalize_path(self, path: str) -> str:
        return path

    def equals(self, other: Any) -> bool:
        return isinstance(other, AccountHandler) and other.root == self.root

    def get_file_info(self, paths: list[str]) -> list[fs.FileInfo]:
        return [self._info(p, self._local.get_file_info(self._in_account(p))) for p in paths]

    def get_file_info_selector(self, selector: fs.FileSelector) -> list[fs.FileInfo]:
        base = self._in_account(selector.base_dir)
        if self._local.get_file_info(base).type == fs.FileType.File:  # a blob is no prefix: nothing below it
            return []
        listed = self._local.get_file_info(fs.FileSelector(base, allow_not_found=selector.allow_not_found,
                                                           recursive=selector.recursive))
        return [self._info(i.path, i) for i in listed]

    def open_input_stream(self, path: str) -> Any:
        return self._local.open_input_stream(self._in_account(path))

    def open_input_file(self, path: str) -> Any:
        return self._local.open_input_file(self._in_account(path))

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return self._local.open_output_stream(self._in_account(path), metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self._local.open_append_stream(self._in_account(path), metadata=metadata)

    def create_dir(self, path: str, recursive: bool) -> None:
        self._local.create_dir(self._in_account(path), recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self._local.delete_dir(self._in_account(path))

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._local.delete_dir_contents(self._in_account(path), missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self._local.delete_dir_contents("", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        self._local.delete_file(self._in_account(path))

    def move(self, src: str, dest: str) -> None:
        self._local.move(self._in_account(src), self._in_account(dest))

    def copy_file(self, src: str, dest: str) -> None:
        self._local.copy_file(self._in_account(src), self._in_account(dest))


def account_of(options: Mapping[str, Any]) -> str:
    """The account Arrow's options (``AzureFileSystem.__reduce__``) reach, as ``emulate_azure`` names accounts."""
    endpoint = str(options["blob_storage_authority"])
    if endpoint == AZURE_BLOB:
        return str(options["account_name"]).lower()
    return f"{options['account_name']}@{endpoint.lower()}"


def emulate_azure(monkeypatch: pytest.MonkeyPatch,
                  accounts: Mapping[str, str | os.PathLike[str]]) -> list[str]:
    """``abfs://`` and ``abfss://`` URIs open the account ``accounts[ACCOUNT]`` (``ACCOUNT@HOST:PORT`` on another
    endpoint; a local directory holding a directory per container) for the rest of the test. Returns the accounts
    connected to, in order."""
    connections: list[str] = []

    def from_uri(uri: str) -> tuple[Any, str]:
        real, path = REAL_FILESYSTEM.from_uri(uri)  # NOTE: Arrow's parse and refusals, as petal meets them
        if not isinstance(real, fs.AzureFileSystem):
            return real, path
        account = account_of(real.__reduce__()[1][0])
        if account not in accounts:
            raise OSError(f"GetProperties failed for '{account}': Couldn't resolve host name")
        connections.append(account)
        return fs.PyFileSystem(AccountHandler(str(Path(accounts[account])))), path

    class EmulatedFileSystem(REAL_FILESYSTEM):  # type: ignore[misc,valid-type]
        """``pyarrow.fs.FileSystem`` with ``from_uri`` opening emulated accounts for ``abfs://``, ``abfss://``."""

    EmulatedFileSystem.from_uri = staticmethod(from_uri)  # type: ignore[assignment]
    monkeypatch.setattr(fs, "FileSystem", EmulatedFileSystem)
    return connections
