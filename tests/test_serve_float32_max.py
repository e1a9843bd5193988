"""``/search`` by ``vectors`` takes every number float32 holds: "3.4028235e38", float32's largest value as numpy,
orjson or any shortest float32 writer prints it, is a little above that value as a float64 and was refused 422 "not a
finite float32 number"; float32 reads it as its largest value. A number float32 rounds to infinity is still 422.

Real components: the session's ``petal serve`` over sample_data indexed with the packaged MiniLM
(``tests/_serve_shared.default_server``), on a loopback port."""

from __future__ import annotations

import numpy as np
import pytest

from tests._serve_shared import default_server

pytest.importorskip("httpx")

JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    return default_server(request, tmp_path_factory)


def _search(server, first: str):
    row = ",".join([first] + ["0"] * 383)  # MiniLM: 384 values; the scores stay finite (stored values are below 1)
    return server.client.post("/search", content=f'{{"vectors": [[{row}]], "k": 3}}'.encode(), headers=JSON)


def test_float32s_largest_value_as_float32_prints_it_is_searched(server):
    assert str(np.finfo(np.float32).max) == "3.4028235e+38"
    printed = _search(server, "3.4028235e38")
    assert printed.status_code == 200, printed.text
    exact = _search(server, repr(float(np.finfo(np.float32).max)))  # the same float32 value, written in full
    assert exact.status_code == 200, exact.text
    assert printed.json()["results"] == exact.json()["results"]
    assert len(printed.json()["results"][0]["hits"]) == 3


def test_a_number_float32_rounds_to_infinity_is_422(server):
    for value in ("3.4028236e38", "3.4028235677973366e38", "-3.5e38"):  # the last two: the halfway point and past it
        refused = _search(server, value)
        assert refused.status_code == 422, (value, refused.text)
        assert "not a finite float32 number" in refused.json()["error"]["message"]
