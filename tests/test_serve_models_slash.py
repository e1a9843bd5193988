"""``GET /v1/models/`` (``/v1/models`` with a trailing slash) is a 404 that names the route to use, as every other
route's trailing slash is; it answered "model '' is not served here", as if the client had asked for a model
named ''.

Real components: a ``petal serve`` child process on an index of precomputed vectors (``served`` of
``tests/test_serve_upgrade_ignored.py``)."""

from __future__ import annotations

import pytest

from tests.test_serve_upgrade_ignored import served  # noqa: F401  (the fixture)


@pytest.mark.parametrize("path", ["/v1/models/", "/v1/models//"])
def test_a_trailing_slash_on_v1_models_names_the_route(served, path):  # noqa: F811
    server, _, _ = served
    answer = server.client.get(path)
    assert answer.status_code == 404, answer.text
    error = answer.json()["error"]
    assert error["type"] == "not_found"
    assert error["message"] == f"no route {path!r} (did you mean '/v1/models'?)"
    assert server.client.get("/v1/models").status_code == 200
