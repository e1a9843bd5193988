"""``petal embed --output X.npy`` where X is a FIFO (or a link to a pipe): the README says such an output is written in
place; a ``.jsonl`` was, a ``.npy`` failed with 74 'Illegal seek' / 'obtaining file position failed' after its header
(numpy writes with a file position; the streamed rows rewrite their header's count at the end), the reader getting
128 bytes. Now the ``.npy`` is made in a temporary file and copied into the pipe whole, equal to a regular file's.
Real ``petal embed`` processes with the packaged model."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

PETAL = str(Path(sys.executable).parent / "petal")


def _through_fifo(tmp_path: Path, *argv: str, name: str = "rows.npy") -> tuple[subprocess.CompletedProcess[str],
                                                                              bytes]:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    got: dict[str, bytes] = {}
    reader = threading.Thread(target=lambda: got.setdefault("data", fifo.read_bytes()), daemon=True)
    reader.start()
    done = subprocess.run([PETAL, "embed", *argv, "--output", str(fifo)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:  # a reader still waiting for a writer (none opened the FIFO) is let go
        with contextlib.suppress(OSError):  # no reader left (ENXIO)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    reader.join(60)
    return done, got.get("data", b"")


@pytest.mark.parametrize("streamed", [False, True])
def test_a_npy_output_into_a_fifo_is_the_whole_file(tmp_path, minilm_dir, streamed):
    texts = ["glaciers move slowly", "volcanoes erupt", "rivers carve canyons"]
    if streamed:  # --input: rows written as they come, the header's count set at the end
        (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
        argv = ["--input", str(tmp_path / "in.txt")]
    else:
        argv = texts
    done, data = _through_fifo(tmp_path, *argv)
    assert done.returncode == 0, done.stderr
    (tmp_path / "piped.npy").write_bytes(data)
    regular = subprocess.run([PETAL, "embed", *argv, "--output", str(tmp_path / "file.npy")], capture_output=True,
                             text=True, timeout=300)
    assert regular.returncode == 0, regular.stderr
    assert data == (tmp_path / "file.npy").read_bytes()
    assert np.load(tmp_path / "piped.npy").shape == (3, 384)
