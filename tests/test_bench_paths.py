"""``petal bench``'s path flags follow the CLI's exit codes (README "Exit codes"), judged before anything loads: an
input (``--corpus``, ``--tokenizer-dir``, ``--index``) that is missing or unreadable is no input (66), a
``--workdir`` that cannot be created or written is 73, each one line naming the flag. Before: click's own check made
an unreadable input or work directory a usage error (2, "Path ... is not readable"), and a missing ``--tokenizer-dir``
or ``--index``, or a ``--workdir`` that is a file, went on to the benchmark. Real ``petal`` processes, without the
capabilities that bypass file modes when run as root."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_input_files import run_unprivileged

# (command, its input flags); every command with a --workdir
INPUTS = [("cpu", ["--corpus"]), ("e2e", ["--corpus", "--tokenizer-dir"]), ("outputs", ["--corpus"]),
          ("serve", ["--index", "--tokenizer-dir"])]
WORKDIRS = ["index", "serve", "startup"]


def last_line(proc) -> str:
    return proc.stderr.strip().splitlines()[-1]


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Path]:
    closed = tmp_path / "closed"
    closed.mkdir()
    (closed / "a.parquet").write_bytes(b"")
    closed.chmod(0)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)  # can be read and entered, not written
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "corpus").mkdir()
    yield {"missing": tmp_path / "missing", "closed": closed, "locked": locked, "file": tmp_path / "a-file"}
    closed.chmod(0o755)
    locked.chmod(0o755)


@pytest.mark.parametrize("command,flags", INPUTS)
def test_an_input_that_is_missing_or_unreadable_is_66_naming_the_flag(command, flags, paths, tmp_path):
    for flag in flags:
        for kind, said in (("missing", "no such file or directory"), ("closed", "cannot be read (Permission denied)")):
            other = [] if flag == "--corpus" else ["--corpus", str(tmp_path / "corpus")]  # the default is not here
            proc = run_unprivileged(["bench", command, *other, flag, str(paths[kind])], tmp_path)
            assert proc.returncode == 66, (command, flag, kind, proc.returncode, proc.stderr[-1500:])
            assert last_line(proc) == f"petal: error: {flag} {paths[kind]}: {said}", proc.stderr[-1500:]


@pytest.mark.parametrize("command", WORKDIRS)
def test_a_workdir_that_cannot_be_used_is_73_naming_the_flag(command, paths, tmp_path):
    for where, said in ((paths["file"], "is a file, not a directory"),
                        (paths["locked"], "cannot be written"),
                        (paths["locked"] / "new", "cannot be created"),
                        (paths["closed"], "cannot be read")):
        corpus = ["--corpus", str(tmp_path / "corpus")] if command == "serve" else []
        proc = run_unprivileged(["bench", command, *corpus, "--workdir", str(where)], tmp_path)
        assert proc.returncode == 73, (command, where, proc.returncode, proc.stderr[-1500:])
        line = last_line(proc)
        assert line.startswith(f"petal: error: --workdir {where}") and said in line, line
