"""``petal serve`` reads a request body with orjson unless it may hold an integer orjson would read as a float (19
digits or more): the check scanned the body with the regex ``\\d{19}`` on the event loop, ~45 ms for 1.2 MB of
vectors, and matched the fraction of any full-precision float in [1e-4, 1e-3) (``0.00012345678901234567``), which
nearly every body of real vectors holds, so those were all read by the standard library, 3-4x slower. Every other
request waited meanwhile. The answers stay ``json.loads``'s."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

orjson = pytest.importorskip("orjson")


def _python_calls(fn, *args) -> list[str]:
    """Each Python function entered and each C function called while ``fn(*args)`` runs (a profile hook: counts,
    not clocks, so a loaded machine cannot fail it)."""
    seen: list[str] = []

    def hook(frame, event, arg):
        if event == "call":
            seen.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
        elif event == "c_call":
            seen.append(f"C:{getattr(arg, '__qualname__', arg)}")

    sys.setprofile(hook)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return seen


def test_a_body_of_vectors_is_read_about_as_fast_as_orjson_reads_it():
    from petal.pipeline.serve.encoding import loads

    rows = np.random.default_rng(0).standard_normal((256, 384)) / 20  # a /search of 256 rows, full precision
    rows[:, :8] = 0.123456789  # and values of few digits, as a client that rounds writes them
    body = json.dumps({"vectors": rows.tolist(), "k": 10}).encode()
    assert b"0.000" in body  # floats in [1e-4, 1e-3): 19 digits and more after the point
    assert loads(body) == json.loads(body)
    # orjson reads it, not the standard library's decoder (3-4x slower: its Python frames show), in a few calls
    calls = _python_calls(loads, body)
    assert not [c for c in calls if "/json/" in c], calls
    assert len(calls) < 20, calls


@pytest.mark.parametrize("body", [
    b'{"k": 12345678901234567890}', b'{"k": -12345678901234567890}', b'{"input": [[1,\n98765432109876543210]]}',
    b'{"k":18446744073709551616}', b'18446744073709551616', b'{"k": 1234567890123456789.5}',
    b'{"k": 1.12345678901234567891234}', b'{"k": 1e-1234567890123456789}', b'{"k": 0.00012345678901234567}',
    b'{"k": "12345678901234567890"}', b'{"k": 123456789012345678}',
])
def test_numbers_read_as_the_standard_library_reads_them(body):
    from petal.pipeline.serve.encoding import loads

    got, want = loads(body), json.loads(body)
    assert got == want and type(got) is type(want), (got, want)
    if isinstance(want, dict) and isinstance(want.get("k"), int):
        assert type(got["k"]) is int


def test_vectors_are_checked_and_converted_without_a_python_loop_per_value():
    """``/search``'s ``vectors`` were checked and converted one value at a time in Python (~20-30 ms of the event loop
    for 256 rows of 384, 24x numpy's conversion of the same rows); now with C loops, the answers the same."""
    from petal.pipeline.serve.requests import RequestError, parse_search
    from petal.pipeline.serve.settings import Limits

    rows = (np.random.default_rng(0).standard_normal((256, 384)) / 20).tolist()
    got = parse_search({"vectors": [list(r) for r in rows]}, Limits()).vectors
    assert got is not None and got.dtype == np.float32
    np.testing.assert_array_equal(got, np.array(rows, dtype=np.float32))
    # no Python step per value (98,304 of them): a few calls a row at most (a set of each row's types)
    calls = _python_calls(parse_search, {"vectors": [list(r) for r in rows]}, Limits())
    assert len(calls) < 8 * len(rows), (len(calls), calls[:50])
    for bad, said in (([[1.0, True]], "non-empty lists of numbers"), ([["1.5"]], "non-empty lists of numbers"),
                      ([[1.0], [10**400]], "row 1 holds a value that is not a finite float32"),
                      ([[1.0], [3.5e38]], "row 1 holds"), ([[1, 2], [1]], "same length, got [1, 2]")):
        with pytest.raises(RequestError, match=re.escape(said)):
            parse_search({"vectors": bad}, Limits())
