"""GCS servers emulated on local directories, for tests: no GCS (nor fake-gcs-server) runs in CI.

``emulate_gcs(monkeypatch, {"": dir1, "http://127.0.0.1:4443": dir2})`` makes
``pyarrow.fs.FileSystem.from_uri("gs://bkt/p/a.parquet")`` return a ``PyFileSystem`` over ``dir1`` (each bucket a
directory in it) and the path ``bkt/p/a.parquet``; ``gs://bkt/...?endpoint_override=127.0.0.1:4443&scheme=http`` one
over ``dir2``. A server is named as Arrow reaches it: ``""`` for Google's own endpoint, ``scheme://host:port`` for a
URI's ``endpoint_override``. An endpoint not listed fails as an unknown host does (``OSError``). Every other URI
goes to pyarrow's own ``from_uri``.

Faithful to Arrow (arrow/cpp/src/arrow/filesystem/gcsfs.cc): the URI is parsed by Arrow itself
(``GcsOptions::FromUri``: ``gs://`` and ``gcs://``, ``anonymous@``, the query's options and its refusals), and only
the filesystem it returns is replaced; paths are ``bucket/key``. With ``credentials=False`` (no
``GOOGLE_APPLICATION_CREDENTIALS``, no metadata server) a request that is not anonymous fails as the GCS client
does, on its OAuth2 token; an anonymous one (``gs://anonymous@...``, a public bucket) is served.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pyarrow import fs

from tests.azure_emulation import AccountHandler

REAL_FILESYSTEM = fs.FileSystem
NO_TOKEN = ("google::cloud::Status(UNAVAILABLE: Retry policy exhausted in GetObjectMetadata: Could not create a "
            "OAuth2 access token to authenticate the request. The request was not sent, as such an access token is "
            "required to complete the request successfully.)")


class BucketsHandler(AccountHandler):
    """One GCS server's buckets: Arrow's GCS paths (``bucket/key``) over the local directory ``root``; every request
    refused for want of a token unless ``allowed`` (anonymous, or credentials in the chain)."""

    def __init__(self, root: str, allowed: bool = True) -> None:
        super().__init__(root)
        self.allowed = allowed

    def __reduce__(self) -> tuple[Any, ...]:
        return BucketsHandler, (self.root, self.allowed)

    def get_type_name(self) -> str:
        return "gcs"

    def _in_account(self, path: str) -> str:
        if not self.allowed:
            raise OSError(NO_TOKEN)
        return path.lstrip("/").rstrip("/")


def emulate_gcs(monkeypatch: pytest.MonkeyPatch, servers: Mapping[str, str | os.PathLike[str]],
                credentials: bool = True) -> list[tuple[str, bool]]:
    """``gs://`` and ``gcs://`` URIs open the server ``servers[ENDPOINT]`` (a local directory holding a directory per
    bucket) for the rest of the test. Returns the (endpoint, anonymous) connected to, in order."""
    connections: list[tuple[str, bool]] = []

    def from_uri(uri: str) -> tuple[Any, str]:
        real, path = REAL_FILESYSTEM.from_uri(uri)  # NOTE: Arrow's parse and refusals, as petal meets them
        if not isinstance(real, fs.GcsFileSystem):
            return real, path
        (options,) = real.__reduce__()[1]
        endpoint = f"{options['scheme']}://{options['endpoint_override']}" if options["endpoint_override"] else ""
        if endpoint not in servers:
            raise OSError(f"google::cloud::Status(UNAVAILABLE: Could not resolve host: {endpoint})")
        connections.append((endpoint, bool(options["anonymous"])))
        allowed = credentials or bool(options["anonymous"])
        return fs.PyFileSystem(BucketsHandler(str(Path(servers[endpoint])), allowed)), path

    class EmulatedFileSystem(REAL_FILESYSTEM):  # type: ignore[misc,valid-type]
        """``pyarrow.fs.FileSystem`` with ``from_uri`` opening emulated GCS servers for ``gs://``, ``gcs://``."""

    EmulatedFileSystem.from_uri = staticmethod(from_uri)  # type: ignore[assignment]
    monkeypatch.setattr(fs, "FileSystem", EmulatedFileSystem)
    return connections
