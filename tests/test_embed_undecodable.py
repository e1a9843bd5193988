"""``petal embed``: a text that is not UTF-8 follows the rule of null and blank texts, in every input.

Before: a ``.parquet`` ``--input`` skipped such rows (invalid_utf8, positions kept) while a ``.txt`` or ``.jsonl``
``--input``, ``--stdin`` and TEXT arguments embedded them with U+FFFD in place of the bad bytes. Now each input
skips it in its place (a null JSON line with ``"skipped"``, a NaN row in a ``.npy``) as ``invalid_utf8`` or
``lone_surrogate`` (``petal index``'s reasons) and the last stderr line counts it with its position; nothing
shifts. A ``.txt`` or ``.jsonl`` is split at ``\\n`` only, as ``--stdin`` is: ``str.splitlines`` also split at
U+2028, U+0085 and form feeds, so one line became two inputs (every later output shifted by one) and a valid
JSON line holding U+2028 was refused.

Real Parquet files (binary and string columns), real files, the packaged MiniLM, real ``petal embed`` processes
(forked from a preloaded interpreter: tests/_perms_shared.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from tests import _perms_shared as perms

GOOD = [b"glaciers flow downhill", b"bread dough rises", b"vector search"]
# input position -> (bytes, why skipped)
BAD = {1: (b"caf\xe9 au lait", "invalid_utf8"), 3: (b"half \xed\xa0\x80 surrogate", "lone_surrogate")}
ROWS = [GOOD[0], BAD[1][0], GOOD[1], BAD[3][0], GOOD[2]]


def embed(*argv: str | bytes, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    """``petal embed ARGV`` (the packaged model) in its own process, forked from a preloaded interpreter
    (tests/_perms_shared.py), ``stdin`` on its stdin. A bytes argument reaches petal as Python's startup reads
    argv: ``os.fsdecode``, undecodable bytes kept as surrogates."""
    args = ["embed", *(os.fsdecode(a) for a in argv)]
    run = perms.petal(args, env={"PETAL_TEST_FAKE_ENGINE": None}, stdin=stdin, unprivileged=False)
    return subprocess.CompletedProcess(["petal", *args], run.rc, run.stdout.encode(), run.stderr.encode())


def invalid_strings(values: list[bytes]) -> pa.Array:
    """A string column holding bytes that are not UTF-8 (pyarrow does not validate on read; other writers can)."""
    return pa.Array.from_buffers(pa.string(), len(values), pa.array(values, pa.binary()).buffers())


def inputs(tmp_path: Path) -> dict[str, list[str]]:
    """The same five texts in every input kind: the flags of each."""
    pq.write_table(pa.table({"text": pa.array(ROWS, pa.binary())}), tmp_path / "binary.parquet")
    pq.write_table(pa.table({"text": invalid_strings(ROWS)}), tmp_path / "string.parquet")
    (tmp_path / "lines.txt").write_bytes(b"\n".join(ROWS) + b"\n")
    (tmp_path / "lines.jsonl").write_bytes(b"".join(b'{"text": "' + row + b'"}\n' for row in ROWS))
    return {"binary parquet": ["--input", str(tmp_path / "binary.parquet")],
            "string parquet": ["--input", str(tmp_path / "string.parquet")],
            "txt": ["--input", str(tmp_path / "lines.txt")],
            "jsonl": ["--input", str(tmp_path / "lines.jsonl")],
            "stdin": ["--stdin"]}


@pytest.fixture(scope="module")
def embedder(minilm_dir) -> petal.Embedder:
    """The packaged model in the test process, loaded once for the module."""
    return petal.Embedder(str(minilm_dir), "cpu")


@pytest.fixture(scope="module")
def expected(embedder) -> np.ndarray:
    return embedder.encode([g.decode() for g in GOOD])


@pytest.mark.parametrize("kind", ["binary parquet", "string parquet", "txt", "jsonl", "stdin"])
def test_every_input_skips_undecodable_texts_in_place(tmp_path, expected, kind):
    flags = inputs(tmp_path)[kind]
    stdin = b"\n".join(ROWS) + b"\n" if kind == "stdin" else b""
    proc = embed(*flags, stdin=stdin)
    assert proc.returncode == 0, proc.stderr.decode()
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [line["index"] for line in lines] == list(range(len(ROWS)))
    for position, (_, why) in BAD.items():
        assert lines[position] == {"index": position, "embedding": None, "skipped": why}
    got = np.array([lines[i]["embedding"] for i in (0, 2, 4)], dtype=np.float32)
    np.testing.assert_allclose(got, expected, atol=2e-6)  # the texts around them, in their places
    last = proc.stderr.decode().strip().splitlines()[-1]
    assert "5 texts -> 3" in last and "2 skipped (invalid_utf8 1, lone_surrogate 1; at inputs 1, 3)" in last, last
    assert "U+FFFD" not in proc.stderr.decode()
    npy = tmp_path / "out.npy"
    proc = embed(*flags, "--output", str(npy), stdin=stdin)
    assert proc.returncode == 0, proc.stderr.decode()
    rows = np.load(npy)
    assert rows.shape == (5, 384) and np.isnan(rows[[1, 3]]).all()
    np.testing.assert_allclose(rows[[0, 2, 4]], expected, atol=2e-6)


def test_text_arguments_follow_the_same_rule(expected):
    proc = embed(GOOD[0].decode(), BAD[1][0], GOOD[1].decode())  # argv bytes: Python reads them with surrogates
    assert proc.returncode == 0, proc.stderr.decode()
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert lines[1] == {"index": 1, "embedding": None, "skipped": "invalid_utf8"}
    np.testing.assert_allclose([lines[0]["embedding"], lines[2]["embedding"]], expected[:2], atol=2e-6)


def test_lines_split_at_newlines_only(tmp_path, embedder):
    """U+2028, U+0085 and a form feed inside a line: still one input per line, in a .txt and a .jsonl."""
    texts = ["first line", "second\u0085half", "third \u2028 part", "form\x0cfeed", "last"]
    (tmp_path / "t.txt").write_text("\n".join(texts) + "\r\n", encoding="utf-8")
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts),
                                      encoding="utf-8")
    expected = embedder.encode(texts)
    for name in ("t.txt", "t.jsonl"):
        proc = embed("--input", str(tmp_path / name), "--output", str(tmp_path / f"{name}.npy"))
        assert proc.returncode == 0, proc.stderr.decode()
        rows = np.load(tmp_path / f"{name}.npy")
        assert rows.shape == (5, 384), (name, rows.shape)
        np.testing.assert_allclose(rows, expected, atol=2e-6)


def test_the_embedder_skips_strings_holding_surrogates(embedder):
    """A str with surrogates (bytes kept by surrogateescape, or a lone surrogate of its own) was embedded with
    U+FFFD, silently; now it is skipped by reason, as the same bytes are."""
    embedded = embedder.embed(
        ["glaciers", "caf\udce9", "half \ud800", b"caf\xe9", b"\xed\xa0\x80", "  "])
    assert embedded.skipped == {1: "invalid_utf8", 2: "lone_surrogate", 3: "invalid_utf8", 4: "lone_surrogate",
                                5: "empty_text"}
    assert np.isfinite(embedded.rows[0]).all() and np.isnan(embedded.rows[1:]).all()
