"""``petal embed --stdin`` answers each line as it arrives: it read all of stdin before answering anything, so a
producer that writes a line and waits for its vector (a coprocess, ``tail -f``, another program's pipe) waited until
it closed stdin. Lines that arrive together are embedded together, packed exactly as one run over the whole input
packs them, so the rows are the same to the last bit. Real processes, the packaged MiniLM."""

from __future__ import annotations

import fcntl
import json
import os
import random
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.conftest import REPO
from tests.pipes import Pipes


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PETAL_")}


def _petal(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *args], input=stdin, capture_output=True,
                          cwd=REPO, env=_env(), timeout=300)


def test_each_line_is_answered_before_stdin_closes():
    proc = subprocess.Popen([sys.executable, "-m", "petal.cli.main", "embed", "--stdin"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=_env())
    with Pipes(proc) as pipes:
        assert proc.stdin is not None
        answers = []
        # a line, a blank line with the start of the next (its rest comes later), the rest: an answer each
        for line in (b"glaciers flow downhill\n", b"\r\nbread rises", b" overnight\r\n"):
            proc.stdin.write(line)
            proc.stdin.flush()
            # read before stdin is closed: each line is answered as it arrives
            answers.append(json.loads(pipes.line(f"the answer to {line!r}")))
        code, rest, err = pipes.finish()
    assert code == 0 and rest == b"", err.decode()[-2000:]
    assert [a["index"] for a in answers] == [0, 1, 2] and answers[1] == {"index": 1, "embedding": None,
                                                                          "skipped": "empty_text"}
    assert "3 texts -> 2 384-dim float32 vectors" in err.decode()
    # each answer is the row of the text embedded alone (as it was embedded: alone in its batch)
    for answer, text in zip(answers[::2], ("glaciers flow downhill", "bread rises overnight")):
        alone = _petal("embed", text)
        assert alone.returncode == 0, alone.stderr.decode()
        assert answer["embedding"] == json.loads(alone.stdout)["embedding"]
    # and the batch run of both lines gives the same vectors (up to the float noise of another batch)
    batch = _petal("embed", "--stdin", stdin=b"glaciers flow downhill\n\nbread rises overnight\n")
    rows = [json.loads(line) for line in batch.stdout.splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2] and rows[1] == answers[1]
    for streamed, batched in zip(answers[::2], rows[::2]):
        np.testing.assert_allclose(streamed["embedding"], batched["embedding"], atol=1e-6)


@pytest.fixture(scope="module")
def small_embedder():
    from petal.pipeline.jobs.embed import Embedder

    # NOTE: a small token budget, so that an input of a few dozen texts makes many packed batches
    return Embedder(device="cpu", max_length=32, token_budget=64, max_seqs=5)


def test_lines_arriving_in_any_chunks_get_the_rows_of_one_run(small_embedder):
    rng = random.Random(7)
    texts: list = [" ".join(rng.choice(["ice", "lava", "bread", "stock", "river", "x" * 40]) for _ in range(n))
                   for n in rng.choices(range(1, 30), k=80)]
    texts[3] = texts[40] = ""
    texts[11] = b"caf\xe9"
    texts[60] = "   "
    whole = small_embedder.embed(texts)
    for trial in range(6):
        cuts = sorted(rng.sample(range(1, len(texts)), trial * 4 + 1))
        pieces = [texts[a:b] for a, b in zip([0, *cuts], [*cuts, len(texts)])]
        # more: whether the next piece was ready at once (the last one: the end of the input)
        chunks = [(piece, trial % 2 == 0 and i + 1 < len(pieces)) for i, piece in enumerate(pieces)]
        answers = list(small_embedder.embed_stream(chunks))
        assert [a.start for a in answers] == list(np.cumsum([0, *[len(a.rows) for a in answers]])[:-1])
        rows = np.concatenate([a.rows for a in answers])
        skipped = {k: v for a in answers for k, v in a.skipped.items()}
        assert skipped == whole.skipped == {3: "empty_text", 11: "invalid_utf8", 40: "empty_text", 60: "empty_text"}
        assert sum(a.truncated for a in answers) == whole.truncated > 0
        if trial % 2 == 0:  # every piece was ready at once: packed as one run, the same rows to the last bit
            np.testing.assert_array_equal(rows, whole.rows)
        else:  # each piece answered as it came: batches closed early, float noise only
            np.testing.assert_allclose(rows, whole.rows, atol=1e-6)


def test_blank_lines_only_write_nothing_and_are_no_input():
    result = _petal("embed", "--stdin", stdin=b"\n \r\n\t\n")
    assert (result.returncode, result.stdout) == (66, b""), result.stderr.decode()
    assert "nothing to embed: 3 skipped (empty_text 3" in result.stderr.decode()


def test_a_promise_of_more_that_brings_no_whole_line_is_taken_back_before_waiting():
    """A chunk said more was ready, and that was only the start of a line whose writer then waits for the answers:
    the reader says so (an empty chunk) before it waits, so the texts held for more are answered; it waited with
    them held, for a line end that never came."""
    from petal.cli.common import _fd_chunks

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 1 << 20)  # room for all of it: the write never blocks
    try:
        os.write(write_end, b"a\n" * 32768 + b"the start of a line")  # one os.read (64 KiB) of whole lines, then more
        chunks = _fd_chunks(read_end, max_bytes=4)
        lines, more = next(chunks)
        assert (len(lines), more) == (32768, True)
        got: list = []
        reader = threading.Thread(target=lambda: got.append(next(chunks)), daemon=True)
        reader.start()
        reader.join(30)
        assert got == [([], False)], "waited for the rest of the line with the promise of more standing"
        os.write(write_end, b", and its end\n")
        assert next(chunks) == ([b"the start of a line, and its end\n"], False)
    finally:
        os.close(write_end)
        os.close(read_end)
