"""``petal``: Parquet shards -> a searchable FAISS index, and queries against it."""

from __future__ import annotations

import gc
import io
import os
import select
import sys

import click

from petal import __version__
from petal._startup import NAMES, quiet_signals, signals_to_python
from petal.cli.bench import bench
from petal.cli.common import CLOSED_AT_START, PetalGroup, defer_gc_for_startup, offline, quiet_stdout
from petal.cli.embed import embed
from petal.cli.index import index
from petal.cli.info import info
from petal.cli.query import query
from petal.cli.rebuild import rebuild
from petal.cli.serve import serve
from petal.cli.verify import verify
from petal.cli.versions import rollback, versions

STOPPED = frozenset(128 + signum for signum in NAMES)  # the exit codes of a command a stop signal ended


class Petal(PetalGroup):
    one_shot = frozenset({"embed", "query"})  # they end startup (startup_done) once model and index are loaded


@click.group(cls=Petal, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="petal")
def cli() -> None:
    """petal: turn Parquet shards of text into a searchable FAISS index, fast.

    \b
    petal index sample_data --out /tmp/idx
    petal query /tmp/idx "how do glaciers move" -k 5
    petal embed "a one-shot query" > vec.jsonl
    petal serve /tmp/idx --port 8080

    Exit codes: 0 ok, 1 bug, 2 usage, 65 bad input, 66 no input, 73 cannot create output,
    74 I/O error, 75 temporary (retry), 78 configuration, 129/130/143 interrupted by SIGHUP/SIGINT/SIGTERM
    (138/140: SIGUSR1/SIGUSR2), 141 stdout closed by its reader.
    """
    signals_to_python()  # the command answers Ctrl-C and SIGTERM from here (PetalGroup.invoke, a run's StopSignals)
    offline()


cli.add_command(index)
cli.add_command(query)
cli.add_command(embed)
cli.add_command(info)
cli.add_command(rebuild)
cli.add_command(serve)
cli.add_command(verify)
cli.add_command(versions)
cli.add_command(rollback)
cli.add_command(bench)


def open_closed_outputs() -> None:
    """A process started with fd 1 or 2 closed (``>&-``, ``2>&-``, a supervisor that gives none) has them on
    ``/dev/null``, and ``sys.stdout``/``sys.stderr`` (``None`` then) write there.

    NOTE: else the next file petal opens takes fd 1 or 2, and what C code prints there (FAISS) lands inside it; and
    ``print(..., file=sys.stderr)`` with ``sys.stderr`` None writes to stdout, into the JSON a reader parses."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            CLOSED_AT_START.add(name)  # NOTE: a command whose results go to stdout refuses to run (require_stdout)
            devnull = os.open(os.devnull, os.O_WRONLY)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, "w", closefd=False))  # noqa: SIM115 (the process's stream, never closed)


class _Stream(io.RawIOBase):
    """fd 1 or 2 under ``sys.stdout``/``sys.stderr``; a descriptor another program left non-blocking is waited on as a
    blocking one (its ``BlockingIOError`` was a failed write of output or message alike)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        try:
            return os.isatty(self._fd)
        except OSError:
            return False

    def _write_some(self, data: bytes) -> int:
        while True:
            try:
                return os.write(self._fd, data)
            except BlockingIOError:
                select.select([], [self._fd], [])


class _Diagnostics(_Stream):
    """fd 2 under ``sys.stderr``: a write the file refuses (``2>/dev/full``, a failing disk under ``2>>LOG``, a
    closed pipe) drops that message. NOTE: stderr holds petal's diagnostics (progress, notes, the summary line, an
    error's message), never output the user asked for, so its failure is no failure of the command: the command's
    own exit code stands (0 for work done and written; 74 only for its output, stdout or a file, that failed).
    Was: the summary line's ``OSError`` became an error whose message failed too, and the process ended 1."""

    def write(self, data: bytes) -> int:  # type: ignore[override]
        try:
            return self._write_some(data)
        except OSError:
            return len(data)


class _Output(_Stream):
    """fd 1 under ``sys.stdout``: a write the file refuses is ``StdoutError`` (74 naming stdout wherever it surfaces:
    --help, --version, a benchmark's table, a run's --json report); a closed pipe stays ``BrokenPipeError`` (141,
    quietly). Was: "I/O error on a file", or a traceback and exit 1 where no command's error mapping ran (--help)."""

    failed = False  # NOTE: a write failed: what it could not write stays buffered, for the interpreter's last flush

    def write(self, data: bytes) -> int:  # type: ignore[override]
        from petal.pipeline.reliability.errors import StdoutError

        try:
            return self._write_some(data)
        except BrokenPipeError:
            raise
        except OSError as exc:
            _Output.failed = True
            raise StdoutError(exc.errno, exc.strerror) from None


def _rewrap(name: str, raw: type[_Stream]) -> None:
    """``sys.<name>`` on ``raw``: same encoding, errors and buffering as the interpreter's."""
    old = getattr(sys, name)
    if not isinstance(old, io.TextIOWrapper):
        return
    try:
        fd = old.fileno()
    except (OSError, ValueError):
        return
    old.flush()
    setattr(sys, name, io.TextIOWrapper(io.BufferedWriter(raw(fd)), encoding=old.encoding, errors=old.errors,
                                        line_buffering=old.line_buffering, write_through=old.write_through))


def tolerant_stderr() -> None:
    """``sys.stderr`` on ``_Diagnostics``."""
    _rewrap("stderr", _Diagnostics)


def named_stdout() -> None:
    """``sys.stdout`` on ``_Output``."""
    _rewrap("stdout", _Output)


def main() -> None:
    """The ``petal`` script: one command, then the process ends."""
    quiet_signals()  # NOTE: the `petal` script took them in petal/__init__.py; `python -m petal.cli.main` from here
    open_closed_outputs()
    tolerant_stderr()
    named_stdout()
    defer_gc_for_startup()
    stopped = False
    try:
        cli()
    except SystemExit as exc:
        stopped = exc.code in STOPPED
        raise
    finally:
        quiet_signals()  # the command has returned (or is exiting): a stop signal now ends the process quietly
        # NOTE: what stdout still buffers is dropped when it refused a write (74, said already: its last flush would
        # fail again, "Exception ignored", exit 120) and when a stop signal ended the command: a signal that came
        # while stdout's reader was not reading (a full pipe) left the line being written buffered, and the last
        # flush waited for that reader, past the signal, for as long as it did not read (then, reader gone, 120)
        if _Output.failed or stopped:
            quiet_stdout()
        # NOTE: the process ends here: the interpreter's last collections would walk every object torch and the
        # model made (0.1-0.5 s on the 2-core machine) to free memory the OS takes back anyway. Frozen, they are
        # skipped; atexit handlers still run, stdout and stderr are still flushed, files were closed by their
        # ``with`` blocks.
        gc.freeze()


if __name__ == "__main__":
    main()
