"""A fake Azure Storage endpoint on loopback for tests: every request answered with one chosen HTTP status and
``x-ms-error-code``, as Azure answers a refused, missing or throttled request. pyarrow's real ``AzureFileSystem`` talks
to it through ``AzureEndpoint.uri`` (plain HTTP, anonymous credentials), so its errors are the ones it raises against
Azure itself: ``... Azure Error: [AuthorizationPermissionMismatch] 403 This request is not authorized ...``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REASONS = {401: "Server failed to authenticate the request.", 403: "This request is not authorized to perform this "
           "operation using this permission.", 404: "The specified container does not exist.",
           503: "The server is busy."}


@dataclass
class AzureEndpoint:
    port: int
    status: int
    error_code: str  # x-ms-error-code: AuthorizationPermissionMismatch, InvalidAuthenticationInfo, ServerBusy, ...
    requests: int = 0

    def uri(self, path: str, account: str = "acct") -> str:
        """``abfs://ACCOUNT@127.0.0.1:PORT/PATH`` (``PATH``: container/blob) over plain HTTP, anonymous."""
        return f"abfs://{account}@127.0.0.1:{self.port}/{path}?enable_tls=false&credential_kind=anonymous"


@contextmanager
def azure_endpoint(status: int, error_code: str, port: int = 0) -> Iterator[AzureEndpoint]:
    """A loopback server answering every request ``status`` with ``error_code`` (``port`` 0: any free one)."""
    endpoint = AzureEndpoint(0, status, error_code)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            endpoint.requests += 1
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            # NOTE: no body: the SDK parses an error's XML body, and one it cannot parse aborted the process
            self.send_response(endpoint.status, REASONS.get(endpoint.status, "Error"))
            self.send_header("x-ms-error-code", endpoint.error_code)
            self.send_header("x-ms-request-id", "00000000-0000-0000-0000-000000000000")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    endpoint.port = int(server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
