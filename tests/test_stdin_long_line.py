"""``--stdin`` reads a line of at most ``MAX_LINE_BYTES`` (16 MiB): the rest of a longer one is dropped up to its
line end, said on stderr, and the line is answered from its first 16 MiB (a model reads a few thousand tokens of a
text at most). Before, an input without line ends (a binary file, ``< /dev/zero``) grew one line in memory until the
kernel killed the process, and a 96 MiB line took ~400 MB over the process's baseline.

Measured as the peak RSS (VmHWM) of a real ``petal embed --stdin`` process with the packaged model, less the peak of
the same command over short lines; no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from petal.cli.main import cli

MB = 1 << 20
REPO = Path(__file__).resolve().parents[1]
CLI = ("import atexit, sys\n"
       "def hwm():\n"
       "    status = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]\n"
       "    print('VmHWM', status, file=sys.stderr)\n"
       "atexit.register(hwm)\n"
       "from petal.cli.main import main\n"
       "sys.argv[0] = 'petal'\n"
       "main()\n")


def embed_stdin(model: Path, data: bytes) -> tuple[list[dict], str, int]:
    done = subprocess.run([sys.executable, "-c", CLI, "embed", "--stdin", "--model", str(model), "--device", "cpu"],
                          cwd=REPO, input=data, capture_output=True, timeout=600)
    stderr = done.stderr.decode()
    assert done.returncode == 0, stderr
    peak = int(stderr.split("VmHWM")[1].split()[0]) * 1024
    return [json.loads(line) for line in done.stdout.splitlines()], stderr, peak


def test_a_line_over_the_cap_is_read_up_to_it_in_bounded_memory(minilm_dir: Path):
    words = b"glacier ice moves downhill "
    long_line = words * (96 * MB // len(words))
    answers, stderr, peak = embed_stdin(minilm_dir, b"short words\n" + long_line + b"\nafter it\n")
    _, _, baseline = embed_stdin(minilm_dir, b"short words\n" + words * 1000 + b"\nafter it\n")
    assert [a["index"] for a in answers] == [0, 1, 2] and all(a["embedding"] for a in answers)
    assert "line 2 holds more than 16 MiB" in stderr
    assert peak - baseline < 128 * MB, (peak - baseline) / MB  # the line's first 16 MiB, a few copies of it
    # the line's answer is the text's: the model reads its first tokens, which the cut keeps
    alone = CliRunner().invoke(cli, ["embed", "--model", str(minilm_dir), "--device", "cpu",
                                     (words * 1000).decode()])
    np.testing.assert_allclose(answers[1]["embedding"], json.loads(alone.stdout)["embedding"], atol=1e-6)


def test_a_line_is_never_cut_inside_a_character(minilm_dir: Path):
    """The cut falls before a UTF-8 character it would split: the line stays text (not invalid_utf8)."""
    from petal.cli.common import MAX_LINE_BYTES

    line = b"glacier " * ((MAX_LINE_BYTES - 1) // 8) + b"a" * ((MAX_LINE_BYTES - 1) % 8) + "\u00e9".encode() * MB
    assert line[MAX_LINE_BYTES - 1] == 0xC3  # the cut would split the first é
    answers, stderr, _ = embed_stdin(minilm_dir, line + b"\nafter it\n")
    assert [a["index"] for a in answers] == [0, 1] and all(a["embedding"] for a in answers)
    assert "line 1 holds more" in stderr and "invalid_utf8" not in stderr


def test_every_line_over_the_cap_is_cut_and_said_wherever_the_reads_fall(tmp_path: Path, capfd):
    """The reader itself (``_fd_chunks``, the file descriptor path of ``--stdin``), over a file and a pipe. Was: a line
    whose end came in the same 64 KiB read that took it over 16 MiB was answered whole (up to 16 MiB + 64 KiB) with
    no warning; only a line still without its end after a read was measured."""
    import os
    import threading

    from petal.cli.common import MAX_LINE_BYTES, STDIN_CHUNK_BYTES, _fd_chunks

    for over, shift in [(0, 0), (1, 0), (40000, 0), (40000, 12345), (65535, 7), (100000, 0), (1, 65535)]:
        long_line = b"w" * (MAX_LINE_BYTES + over)
        data = b"s" * shift + b"\n" + long_line + b"\nafter\n"
        for kind in ("file", "pipe"):
            if kind == "file":
                (tmp_path / "in").write_bytes(data)
                fd = os.open(tmp_path / "in", os.O_RDONLY)
                writer = None
            else:
                fd, write_fd = os.pipe()
                writer = threading.Thread(target=_write_all, args=(write_fd, data))
                writer.start()
            try:
                lines = [line for chunk, _ in _fd_chunks(fd, STDIN_CHUNK_BYTES) for line in chunk]
            finally:
                os.close(fd)
                if writer is not None:
                    writer.join()
            said = capfd.readouterr().err
            case = (over, shift, kind)
            assert [len(line) for line in lines] == [shift + 1, min(len(long_line), MAX_LINE_BYTES) + 1, 6], case
            assert lines[1].endswith(b"\n") and lines[2] == b"after\n", case
            assert ("--stdin line 2 holds more than 16 MiB" in said) == (over > 0), (case, said)


def _write_all(fd: int, data: bytes) -> None:
    import os

    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.close(fd)
