"""HDFS namenodes emulated on local directories, for tests: Arrow's ``HadoopFileSystem`` needs libhdfs and a JVM,
which CI does not have.

``emulate_hdfs(monkeypatch, {"nn1:8020": dir1, "nn2:8020": dir2}, default="nn1:8020")`` makes
``pyarrow.fs.FileSystem.from_uri("hdfs://nn1:8020/data/x")`` return a ``PyFileSystem`` over ``dir1`` and the path
``/data/x``; ``hdfs:///data/x`` (no authority) reaches the ``default`` namenode (Hadoop's ``fs.defaultFS``); a
namenode not listed fails as a connection refused does (``OSError``). Every other URI goes to pyarrow's own
``from_uri``.

Faithful to Arrow's paths (arrow/cpp/src/arrow/filesystem/hdfs.cc): ``from_uri`` gives the URI's path, absolute and
without the authority; ``get_file_info(path)`` names an entry by the path as given; a ``FileSelector`` listing names
entries by absolute paths (libhdfs lists ``hdfs://host:port/data/x``; Arrow strips the scheme and authority).
The substitution is of the ``pyarrow.fs.FileSystem`` attribute, which petal reaches as ``fs.FileSystem.from_uri``
at call time, so it applies to a CLI run in-process (``tests.fake_cli.invoke``). The handler pickles (by its root
directory), as a filesystem sent to a worker does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import pytest
from pyarrow import fs

REAL_FILESYSTEM = fs.FileSystem


class NamenodeHandler(fs.FileSystemHandler):
    """One namenode's namespace: absolute HDFS paths (``/data/x``) over the local directory ``root``."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._local = fs.SubTreeFileSystem(root, fs.LocalFileSystem())

    def __reduce__(self) -> tuple[Any, ...]:
        return NamenodeHandler, (self.root,)

    def _below_root(self, path: str) -> str:
        if not path.startswith("/"):  # NOTE: a relative HDFS path is under the user's home: never used by petal
            raise ValueError(f"emulated HDFS takes absolute paths only, not {path!r}")
        return path.strip("/")

    def _info(self, path: str, local: fs.FileInfo) -> fs.FileInfo:
        return fs.FileInfo(path, local.type, mtime_ns=local.mtime_ns, size=local.size)

    def get_type_name(self) -> str:
        return "hdfs"

    def normalize_path(self, path: str) -> str:
        return path

    def equals(self, other: Any) -> bool:
        return isinstance(other, NamenodeHandler) and other.root == self.root

    def get_file_info(self, paths: list[str]) -> list[fs.FileInfo]:
        return [self._info(p, self._local.get_file_info(self._below_root(p))) for p in paths]

    def get_file_info_selector(self, selector: fs.FileSelector) -> list[fs.FileInfo]:
        base = self._below_root(selector.base_dir)
        if self._local.get_file_info(base).type == fs.FileType.File:  # Arrow's own check (Status::Invalid)
            raise ValueError("GetFileInfo expects base_dir of selector to be a directory, while "
                             f"'{selector.base_dir}' is a file")
        listed = self._local.get_file_info(fs.FileSelector(base, allow_not_found=selector.allow_not_found,
                                                           recursive=selector.recursive))
        return [self._info("/" + i.path, i) for i in listed]

    def open_input_stream(self, path: str) -> Any:
        return self._local.open_input_stream(self._below_root(path))

    def open_input_file(self, path: str) -> Any:
        return self._local.open_input_file(self._below_root(path))

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return self._local.open_output_stream(self._below_root(path), metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self._local.open_append_stream(self._below_root(path), metadata=metadata)

    def create_dir(self, path: str, recursive: bool) -> None:
        self._local.create_dir(self._below_root(path), recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self._local.delete_dir(self._below_root(path))

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._local.delete_dir_contents(self._below_root(path), missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self._local.delete_dir_contents("", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        self._local.delete_file(self._below_root(path))

    def move(self, src: str, dest: str) -> None:
        self._local.move(self._below_root(src), self._below_root(dest))

    def copy_file(self, src: str, dest: str) -> None:
        self._local.copy_file(self._below_root(src), self._below_root(dest))


def emulate_hdfs(monkeypatch: pytest.MonkeyPatch, namenodes: Mapping[str, str | os.PathLike[str]],
                 default: str) -> list[tuple[str, str | None]]:
    """``hdfs://HOST:PORT/...`` opens the namenode ``namenodes[HOST:PORT]`` (a local directory), ``hdfs:///...`` the
    ``default`` one, for the rest of the test. Returns the connections made, each ``(HOST:PORT, user)``: the user as
    Arrow takes it, from ``?user=`` or ``HADOOP_USER_NAME`` (``None``: the process's), never from user info."""
    connections: list[tuple[str, str | None]] = []

    def from_uri(uri: str) -> tuple[Any, str]:
        if not uri.lower().startswith("hdfs://"):
            return REAL_FILESYSTEM.from_uri(uri)
        parts = urlsplit(uri)
        authority = parts.netloc.rpartition("@")[2] or default  # NOTE: Arrow ignores user info; ?user= names one
        if authority not in namenodes:
            raise OSError(f"HDFS connection to {authority} failed: Connection refused")
        connections.append((authority, dict(parse_qsl(parts.query)).get("user") or os.environ.get("HADOOP_USER_NAME")))
        root = Path(namenodes[authority])
        return fs.PyFileSystem(NamenodeHandler(str(root))), unquote(parts.path) or "/"

    class EmulatedFileSystem(REAL_FILESYSTEM):  # type: ignore[misc,valid-type]
        """``pyarrow.fs.FileSystem`` with ``from_uri`` opening emulated namenodes for ``hdfs://``."""

    EmulatedFileSystem.from_uri = staticmethod(from_uri)  # type: ignore[assignment]
    monkeypatch.setattr(fs, "FileSystem", EmulatedFileSystem)
    return connections
