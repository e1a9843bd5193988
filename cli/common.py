"""What every command shares: error-to-exit-code mapping, the offline guard, common options."""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast, overload

import click
from click.core import ParameterSource

F = TypeVar("F", bound=Callable[..., Any])


class PathParam(click.Path):
    """A path argument or option (``pathlib.Path``) that checks nothing on disk at parsing (``readable=False``: click's
    own check would make an unreadable path a usage error, 2; each command judges its paths, README "Exit codes")
    and refuses an empty value: ``""`` (an unset variable, ``--out "$OUT"``) is no path, never the current directory
    that ``Path("")`` makes of it (``petal index SRC --out ""`` wrote an index into the working directory)."""

    def __init__(self) -> None:
        super().__init__(path_type=Path, readable=False)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value:
            self.fail(f"{value!r} is an empty path; give a path ('.' for the current directory)", param, ctx)
        if isinstance(value, str):
            # NOTE: a file:// URL is the local path it names (as a SOURCE's: it was Path('file:/...'), 'no such file');
            # another URL is refused: only a SOURCE is read from object storage (--out s3://b/idx made a local
            # directory 's3:'); 'a:b' made absolute: pyarrow would take it for a URI. The same conversion as every
            # path argument of the Python API (remote.path_argument).
            from petal.pipeline.ingest.remote import path_argument
            from petal.pipeline.reliability.errors import UsageError

            try:
                value = str(path_argument(value))
            except UsageError as exc:
                self.fail(str(exc), param, ctx)
        return super().convert(value, param, ctx)


class NonEmptyText(click.ParamType):
    """A str flag that has no meaning empty, refused naming the flag rather than taken for something else: ``--model
    ""`` (MODEL unset) would embed with the packaged model, not the one meant; ``--host ""`` would listen on every
    interface; ``--served-model-name ""`` fall back to the directory's name."""

    def __init__(self, name: str, message: str) -> None:
        self.name, self.message = name, message

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value:
            self.fail(self.message, param, ctx)
        return value


class ModelParam(NonEmptyText):
    """``--model``: a model directory or a cached Hugging Face id (``NonEmptyText``); a ``file://`` URL is the local
    directory it names, another URL a usage error naming it (``remote.model_argument``, as the API's ``model=``)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        value = super().convert(value, param, ctx)
        if isinstance(value, str):
            from petal.pipeline.ingest.remote import model_argument
            from petal.pipeline.reliability.errors import UsageError

            try:
                value = model_argument(value)
            except UsageError as exc:
                self.fail(str(exc), param, ctx)
        return value


PATH = PathParam()
MODEL_DIR = ModelParam("directory", "'' is an empty path; leave --model out for the default")
NON_EMPTY = NonEmptyText("text", "must not be empty")


def offline() -> None:
    """No network at run time: set before any Hugging Face import, whatever the environment says (a shell's
    ``HF_HUB_OFFLINE=0`` exported for other tools, an ``HF_ENDPOINT``, were kept: the libraries, and every worker
    process petal starts, ran online)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        os.environ[name] = "1"


# NOTE: set by ``main()``, the ``petal`` script, whose process ends with its command: cyclic GC is off while
# the command imports torch and loads its model, then what was made is frozen (see ``startup_done``)
_startup_gc = {"deferred": False}


def defer_gc_for_startup() -> None:
    """The process runs one command and ends (``main()``): no cyclic GC until ``startup_done()``.

    ``import torch`` alone runs ~380 collections (0.2 s of a one-shot process on the 2-core machine) that find
    nothing to free: module objects live until the process ends.
    """
    if gc.isenabled():
        gc.disable()
        _startup_gc["deferred"] = True


def startup_done() -> None:
    """The command's long-lived objects (libraries, model, index) exist: freeze them (later collections, and
    the interpreter's at exit, skip them) and turn cyclic GC back on. Nothing to do in-process (CliRunner,
    ``cli.main``): only ``defer_gc_for_startup`` turned it off."""
    if _startup_gc["deferred"]:
        _startup_gc["deferred"] = False
        gc.freeze()
        gc.enable()


def freeze_long_lived() -> None:
    """A long-running command (``petal serve``) has made what lives as long as the process (the libraries'
    modules and compiled kernels, the model): collect what is garbage now, then freeze the rest, so that no
    later full collection walks it again.

    NOTE: the libraries and the packaged MiniLM leave ~190k objects for the collector (CPU; more with CUDA's
    kernels), which every full collection walks: 140-165 ms on the 2-core machine, a 105 ms pause under load on
    the H200 host that stalled every request in flight (``petal bench serve``'s gc figures; README "Serving").
    Frozen objects are still freed by reference counting, but a cycle among them never would be: freeze only
    what is never replaced (not an index version).
    """
    gc.collect()
    gc.freeze()


@dataclass(frozen=True)
class Hooks:
    """What a program running petal's CLI in-process may hand it as click's ``obj``
    (``cli.main(args, obj=Hooks(...))``, ``CliRunner().invoke(cli, args, obj=Hooks(...))``)."""

    engine_factory: Callable[..., Any] | None = None  # replaces the engine of ``petal index`` (petal's tests)


def hooks() -> Hooks:
    """The running command's ``Hooks`` (none given: the defaults)."""
    found = click.get_current_context().find_object(Hooks)
    return found if found is not None else Hooks()


class PetalClickError(click.ClickException):
    """A user-facing failure with the exit code of the contract (65, 66, 73, 74, 75, 78, ...)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it a ClassVar; the code is per error

    def show(self, file: Any = None) -> None:
        from petal.pipeline.reliability.errors import one_line

        click.echo(f"petal: error: {one_line(self.format_message())}", err=True)


@overload
def user_errors(func: F, *, outputs: tuple[str, ...] | None = None) -> F: ...


@overload
def user_errors(func: None = None, *, outputs: tuple[str, ...] | None = None) -> Callable[[F], F]: ...


def user_errors(func: F | None = None, *, outputs: tuple[str, ...] | None = None) -> F | Callable[[F], F]:
    """Turn ``PetalError`` (and a model's ``ModelError``) into a clean message and its exit code;
    ``UsageError`` (a bad setting) into click's usage error (exit 2); an ``OSError`` nothing mapped on its
    way up (a failing disk) is exit 74 naming the file, a host ``MemoryError`` 74 too.

    ``outputs``: the names of the command's parameters that hold the paths it writes (``("output",)``; ``()``: a
    command that writes nothing). Permission denied that nothing mapped is then no I/O error: on a path inside one
    of them 73 (cannot create output), on any other path 66 (a file petal reads). Left out (``@user_errors``), a
    path's role is unknown and it stays 74 (``io_error``)."""

    def decorate(command: F) -> F:
        assert outputs is None or set(outputs) <= set(inspect.signature(command).parameters), outputs

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from petal.engine.errors import ModelError, ModelFlagError
            from petal.pipeline.reliability.errors import (
                EXIT_CONFIG,
                EXIT_USAGE,
                FlagError,
                PetalError,
                UsageError,
                io_error,
                out_of_memory,
            )

            try:
                return command(*args, **kwargs)
            except UsageError as exc:
                if isinstance(exc, FlagError):  # NOTE: judged by the run: its message, exit 2, no usage banner
                    raise PetalClickError(cut_numbers(str(exc)), exc.exit_code) from exc
                raise click.UsageError(str(exc)) from exc
            except PetalError as exc:
                raise PetalClickError(str(exc), exc.exit_code) from exc
            except ModelError as exc:  # a flag the model cannot take (--attention-mask): 2, as a FlagError
                raise PetalClickError(str(exc), EXIT_USAGE if isinstance(exc, ModelFlagError) else EXIT_CONFIG) from exc
            except BrokenPipeError:
                raise  # stdout's reader went away: PetalGroup ends quietly
            except OSError as exc:
                written = None if outputs is None else [kwargs[name] for name in outputs
                                                        if kwargs.get(name) is not None]
                error = io_error(exc, written)
                raise PetalClickError(str(error), error.exit_code) from exc
            except MemoryError as exc:  # the host ran short where no read path named its file: 74, not a bug
                error = out_of_memory(exc)
                raise PetalClickError(str(error), error.exit_code) from exc

        return cast(F, wrapper)

    return decorate if func is None else decorate(func)


class PetalGroup(click.Group):
    """The ``petal`` group: a closed stdout (``petal query ... | head -1``) ends the process quietly
    with exit 141 (128 + SIGPIPE), as a Unix tool killed by SIGPIPE would, instead of a traceback.

    ``one_shot``: commands that call ``startup_done()`` themselves once loaded; any other turns cyclic GC
    back on before it runs (a long run must collect as usual)."""

    one_shot: frozenset[str] = frozenset()

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                             list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if name not in self.one_shot:
            startup_done()
        return name, command, rest

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().main(*args, **kwargs)
        except BrokenPipeError:
            quiet_stdout()
            sys.exit(141)

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        # NOTE: ``petal --help``/``--version`` print while the arguments are parsed, before any command's mapping:
        # click's main took a closed pipe for exit 1 and a full stdout for a traceback
        with stdout_failures():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        from petal.pipeline.reliability.errors import cli_names

        try:
            with stdout_failures(), cli_names():  # NOTE: the API a command calls names its flags, not their keywords
                return super().invoke(ctx)
        except click.UsageError as exc:  # click's own (``'999...' is not a valid integer``), a command's: numbers cut
            exc.message = cut_numbers(exc.message)  # type: ignore[misc]  # click declares it Final; set once, here
            raise
        except KeyboardInterrupt as exc:
            # NOTE: a stop signal that no run's own handling turned into ``Interrupted`` (``petal query --stdin``
            # waiting for a line, ``petal embed`` reading stdin or loading its model): click would say "Aborted!" and
            # exit 1, the code of a bug; the contract's is 128 + the signal's number (SIGINT 130, SIGTERM 143, ...)
            from petal._startup import StopSignal, message
            from petal.pipeline.reliability.errors import EXIT_SIGINT

            signum = exc.signum if isinstance(exc, StopSignal) else EXIT_SIGINT - 128
            with contextlib.suppress(OSError, ValueError):
                click.echo(message(signum), err=True)
            ctx.exit(128 + signum)


def cut_numbers(message: str) -> str:
    """``message`` with each run of over 40 digits cut to 40 and its length, as ``pipeline.config.shown`` cuts a
    value (a 5000-digit value was echoed whole by click's int types)."""
    return re.sub(r"[0-9]{41,}", lambda m: f"{m[0][:40]}... ({len(m[0])} digits)", message)


@contextlib.contextmanager
def stdout_failures() -> Iterator[None]:
    """A stdout that fails where no command's error mapping runs (``--help``, ``--version``, a command's own help):
    a closed pipe ends quietly, 141 (128 + SIGPIPE, as a Unix tool killed by it); any other failure (``StdoutError``:
    a full disk, ``/dev/full``) is 74 naming stdout."""
    from petal.pipeline.reliability.errors import StdoutError, io_error

    try:
        yield
    except BrokenPipeError:
        quiet_stdout()
        raise click.exceptions.Exit(141) from None
    except StdoutError as exc:
        quiet_stdout()
        error = io_error(exc)
        raise PetalClickError(str(error), error.exit_code) from None


def stdin_lines() -> Iterator[bytes]:
    """``--stdin``'s lines one by one as they arrive (``stdin_chunks``)."""
    for lines, _ in stdin_chunks():
        yield from lines


# --stdin: a chunk of lines is cut once it holds this many bytes (the rest is read for the next one)
STDIN_CHUNK_BYTES = 1 << 20
# NOTE: --stdin: a line over this many bytes is read up to it and the rest of it dropped, said on stderr: an input
# without line ends (a binary file, `< /dev/zero`) grew one line until the kernel killed the process. A model reads at
# most a few thousand tokens of a text; the tokenizer's own cap is 64 characters a token (pipeline/ingest/tokens.py)
MAX_LINE_BYTES = 16 << 20


def stdin_chunks(max_bytes: int = STDIN_CHUNK_BYTES) -> Iterator[tuple[list[bytes], bool]]:
    """``--stdin``'s lines as they arrive, in chunks: each holds every whole line there to read without waiting (at
    least one; about ``max_bytes`` at most), with whether more is ready at once (``(lines, more)``; where no whole
    line came of that more, an empty chunk ``([], False)`` says so before the wait). Line ends and a leading byte
    order mark are dropped (``text_rule.input_lines``); the last line needs no line end.

    A closed stdin (``<&-``: Python sets ``sys.stdin`` to ``None``) is no input (66); one that fails to read is 74
    naming stdin (its ``OSError`` carries no file name). A non-blocking stdin is waited on as a blocking one.
    The closed stdin is said by this call, before the first chunk is asked for (before a model loads)."""
    from petal.pipeline.reliability.errors import NoInputError

    if sys.stdin is None:
        raise NoInputError("--stdin: stdin is closed (no file descriptor 0); give it input (< FILE, or a pipe)")
    return _stdin_chunks(max_bytes)


def _stdin_chunks(max_bytes: int) -> Iterator[tuple[list[bytes], bool]]:
    from petal.pipeline.ingest.text_rule import input_lines
    from petal.pipeline.reliability.errors import PetalIOError

    assert sys.stdin is not None
    try:
        try:
            fd: int | None = sys.stdin.fileno()
        except (OSError, ValueError):  # NOTE: no file descriptor (a stream put in its place: CliRunner)
            fd = None
        chunks = _stream_chunks(sys.stdin.buffer, max_bytes) if fd is None else _fd_chunks(fd, max_bytes)
        first = True
        for lines, more in chunks:
            yield list(input_lines(lines, starts_input=first)), more
            first = first and not lines
    except OSError as exc:  # NOTE: only the reads: what the caller does with a line is not inside this generator
        raise PetalIOError(f"cannot read --stdin: {exc.strerror or exc}") from exc


def _stream_chunks(stream: Any, max_bytes: int) -> Iterator[tuple[list[bytes], bool]]:
    """The lines of a stream without a file descriptor (``CliRunner``'s), ``max_bytes`` at a time: all of it is there
    to read, so a chunk cut at ``max_bytes`` says more is ready."""
    lines: list[bytes] = []
    size = 0
    for number, line in enumerate(iter(lambda: stream.readline(MAX_LINE_BYTES + 1), b""), 1):
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            line = _cut_line(line, number)
            while (rest := stream.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                pass  # the rest of the line, dropped
        lines.append(line)
        size += len(line)
        if size >= max_bytes:
            yield lines, True
            lines, size = [], 0
    if lines:
        yield lines, False


def _fd_chunks(fd: int, max_bytes: int) -> Iterator[tuple[list[bytes], bool]]:
    """The lines of ``fd`` (each with its ``\n``) in chunks of what has arrived: waited for with ``poll`` until the
    first whole line is there (a line arriving in pieces is joined), then every line there to read without waiting
    joins the chunk, up to ``max_bytes``. Read with ``os.read``, so a pipe's lines are answered as they come, never
    held for a buffer to fill.

    NOTE: ``poll``, not ``select``, which refuses a descriptor over 1023. A descriptor opened O_NONBLOCK (a terminal
    a program such as node left so, a parent's pipe; shared with others, so never switched back) is waited on as a
    blocking one: Python's buffered reader returns ``b""`` from it when no byte is there yet, which reading by lines
    took for the end of the input (petal query --stdin and petal embed --stdin ended at once with 'nothing to ...:
    --stdin is empty', 66, while the writer was still on its way)."""
    import select

    poller = select.poll()
    poller.register(fd, select.POLLIN)
    pending = bytearray()
    ended = promised = False  # promised: the last chunk said more was ready
    dropping = False  # the rest of a line over MAX_LINE_BYTES is being read and dropped, up to its line end
    number = 0  # lines read
    while not ended:
        lines: list[bytes] = []
        size = 0
        while size < max_bytes or not lines:
            if not lines and promised and not poller.poll(0):
                # NOTE: more was ready, but no whole line came of it (the start of a line whose writer now waits for
                # the answers): say so before waiting, so that what the caller holds for it is answered first
                yield [], False
                promised = False
            if not poller.poll(0 if lines else -1):
                break  # NOTE: nothing more to read now: answer what is here, never wait to fill the chunk
            try:
                read = os.read(fd, 1 << 16)
            except BlockingIOError:  # another reader of the same pipe took the bytes first
                if lines:
                    break
                continue
            if not read:
                ended = True
                break
            size += len(read)
            start, searched = 0, len(pending)
            pending += read
            if dropping:
                if (end := pending.find(b"\n")) < 0:
                    pending.clear()
                    continue
                start = searched = end + 1
                dropping = False
            while (end := pending.find(b"\n", searched)) >= 0:
                number += 1
                # NOTE: a line whose end came in the read that took it over the cap was answered whole, unsaid (16
                # MiB and up to a read's 64 KiB more): only what was still pending after a read was measured
                fits = end - start <= MAX_LINE_BYTES
                lines.append(bytes(pending[start:end + 1]) if fits else _cut_line(bytes(pending[start:end]), number))
                start = searched = end + 1
            del pending[:start]
            if len(pending) > MAX_LINE_BYTES:
                number += 1
                lines.append(_cut_line(bytes(pending), number))
                pending.clear()
                dropping = True
        if ended and pending:
            lines.append(bytes(pending))
        if lines:
            promised = not ended and bool(poller.poll(0))
            yield lines, promised


def _cut_line(line: bytes, number: int) -> bytes:
    """``line`` (over ``MAX_LINE_BYTES`` with no line end yet) cut to its first ``MAX_LINE_BYTES`` bytes, not inside a
    UTF-8 character, said on stderr; the caller drops the rest of it."""
    end = MAX_LINE_BYTES
    start = end  # the last character that begins before the cut: kept whole or left out
    while start > end - 4 and line[start - 1] & 0xC0 == 0x80:
        start -= 1
    lead = line[start - 1]
    if lead >= 0xC0 and end - start + 1 < (2 if lead < 0xE0 else 3 if lead < 0xF0 else 4):
        end = start - 1
    eprint(f"petal: warning: --stdin line {number} holds more than {MAX_LINE_BYTES >> 20} MiB before its line end: "
           f"its first {MAX_LINE_BYTES >> 20} MiB are read as the line, the rest of it is dropped")
    return line[:end] + b"\n"


# NOTE: line boundaries of str.splitlines() (and of Java's, and many log shippers' line readers) that json.dumps with
# ensure_ascii=False writes raw inside strings: escaped, each JSON line stays one line for every reader
_LINE_BREAKS = {ord("\u2028"): "\\u2028", ord("\u2029"): "\\u2029", ord("\x85"): "\\u0085"}


def json_text(value: Any, **options: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, **options)`` on one line for every line reader: U+2028, U+2029 and NEL
    inside its strings written as JSON escapes (the rest of its text as it is)."""
    import json

    # NOTE: a stdout that cannot hold every character (PYTHONIOENCODING=latin-1, a cp1252 console): JSON escapes,
    # the same JSON to a reader, where a character it cannot encode was a UnicodeEncodeError traceback
    return json.dumps(value, ensure_ascii=not stdout_takes_unicode(), **options).translate(_LINE_BREAKS)


def float_row_text(row: Any) -> str:
    """JSON array text of a float32 or float16 numpy row, each value at the shortest text that reads back (JSON's
    float, then the row's dtype) as the same value: numpy's ``str`` of the scalar (Dragon4, unique digits for its
    dtype); a NaN or infinite value as ``json.dumps`` writes it (``NaN``, ``Infinity``).

    NOTE: ``round(x, 7)`` changed values (a component 1.4e-33 written 0.0; most components of a row differed from
    the ``.npy``'s by an ulp or more); ``json.dumps`` of the row as Python floats writes float64's 17 digits for a
    float32 (1.7x the text) and more than float16's for a float16. About as fast as the rounding it replaces."""
    import json

    import numpy as np

    if np.isfinite(row).all():
        return "[" + ", ".join(map(str, row)) + "]"
    return "[" + ", ".join(str(x) if np.isfinite(x) else json.dumps(float(x)) for x in row) + "]"


def float32_value(value: float) -> float:
    """``value`` (a float32's, as FAISS scores are) as the float whose JSON text is the shortest that reads back as
    that float32 (``0.83472`` for float32 0.83472, not ``0.8347200155258179``); a value float32 does not hold, as it
    is. NOTE: ``round(score, 6)`` made distinct scores equal and small ones 0.0 (an L2 distance of 1e-7)."""
    import numpy as np

    single = np.float32(value)
    if not np.isfinite(single) or float(single) != value:
        return value
    return float(str(single))


def stdout_takes_unicode() -> bool:
    """stdout's encoding is a UTF one (it can hold every character)."""
    import codecs

    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        return codecs.lookup(encoding).name.startswith("utf")
    except LookupError:
        return False


def write_stdout(lines: Iterable[str], flush: bool = False) -> None:
    """``lines`` to stdout, one each (``click.echo``). A stdout that fails (a full disk or a failing one under
    ``> FILE``, ``/dev/full``) is 74 naming stdout: the ``OSError`` carries no file name, and was said as "I/O error
    on a file". A closed pipe stays a ``BrokenPipeError`` (``PetalGroup``: 141, quietly)."""
    from petal.pipeline.reliability.errors import PetalIOError

    try:
        for line in lines:
            try:
                click.echo(line)
            except UnicodeEncodeError:  # NOTE: a stdout that cannot hold a character (latin-1): its escape instead
                encoding = sys.stdout.encoding
                click.echo(line.encode(encoding, "backslashreplace").decode(encoding))
        if flush:
            sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise PetalIOError(f"cannot write the output to stdout: {exc.strerror or exc}") from exc


def quiet_stdout() -> None:
    """Point fd 1 at /dev/null, so the interpreter's final flush of a closed pipe says nothing."""
    if sys.stdout is None:  # fd 1 was closed from the start: nothing buffered, nothing to flush
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def usage(fn: Callable[[], Any]) -> Any:
    """Run a constructor that validates flags; its ``ValueError`` becomes a usage error (exit 2)."""
    try:
        return fn()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def run_with_report(report: Any, work: Callable[[], Any], as_json: bool = False,
                    json_report: Path | None = None) -> None:
    """Run an API call that finishes ``report`` (``petal.index``, ``petal.rebuild``), print the report
    (JSON on stdout with ``as_json``) and its summary as the last stderr line, and turn the call's error
    into the exit code. ``json_report``: the file the call wrote the report to, written again when stdout then
    refuses the report (it said exit 0; the command exits 74)."""
    from petal.pipeline.reliability.errors import FlagError, PetalError, UsageError

    def finish(done: bool = False) -> None:
        """``done``: the run did its work, so a stdout that refuses its report is the command's failure (74 naming
        stdout, as ``--json-report FILE``; a closed pipe 141, quietly); after a failure the run's code stays."""
        unwritten: PetalError | None = None
        if as_json:
            from petal.pipeline.api import report_missing, stdout_report_error
            from petal.pipeline.jobs.report_file import STDOUT

            try:
                report.write(STDOUT)
            except BrokenPipeError:
                quiet_stdout()
                if done:
                    eprint(report.summary())
                    raise
            except OSError as exc:
                quiet_stdout()
                if done:
                    unwritten = report_missing(report, stdout_report_error(exc))
                    if json_report is not None and str(json_report) != "-":
                        from petal.pipeline.api import write_report

                        write_report(report, json_report)  # NOTE: the file said success, exit 0
                else:
                    eprint(f"petal: warning: cannot write the report to stdout: {exc.strerror or exc}")
        eprint(report.summary())
        if unwritten is not None:
            raise PetalClickError(str(unwritten), unwritten.exit_code)

    closed_stdout_refused(report, as_json, json_report)
    try:
        work()
    except UsageError as exc:
        finish()
        if isinstance(exc, FlagError):
            raise PetalClickError(str(exc), exc.exit_code) from exc
        raise click.UsageError(str(exc)) from exc
    except PetalError as exc:
        finish()
        raise PetalClickError(str(exc), exc.exit_code) from exc
    except BaseException:
        if report.exit_code is not None:
            finish()
        raise
    finish(done=True)


def closed_stdout_refused(report: Any, as_json: bool, json_report: Path | None) -> None:
    """The report of ``petal index``/``rebuild`` goes to stdout only (``--json``, ``--json-report -``) and the process
    started with stdout closed: 74 naming stdout before any work (``require_stdout``). NOTE: was a whole run
    published, exit 0, its report written nowhere. ``--json`` with a ``--json-report FILE`` runs: the report reaches
    the file (tests/test_closed_outputs.py)."""
    from petal.pipeline.reliability.errors import PetalError

    if json_report is not None and str(json_report) != "-":
        return
    to_stdout = [flag for flag, given in (("--json", as_json), ("--json-report -", json_report is not None)) if given]
    if not to_stdout:
        return
    try:
        require_stdout(f"petal {report.command} {' and '.join(to_stdout)}")
    except PetalError as exc:
        report.finish("failed", exc.exit_code, str(exc))
        eprint(report.summary())
        raise PetalClickError(str(exc), exc.exit_code) from None


class ReportingCommand(click.Command):
    """A command with ``--json-report`` (``petal index``, ``petal rebuild``) whose flag-parsing errors still finish
    a report (status failed, exit 2, ``usage error: ...``) and write it where the arguments say: to the
    ``--json-report`` path when click's parser finds one, and on stdout with ``--json``; errors the run judges write
    their report themselves (``pipeline/api.py``). The command's name is the report's ``command``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # NOTE: click's parser consumes ``args`` in place
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            path, as_json = self._report_flags(ctx, given)
            path = path or None  # NOTE: "" is no path (the usage error names it), never "." to write into
            if path is not None or as_json:
                from petal.pipeline.api import write_report
                from petal.pipeline.jobs.report import RunReport

                report = RunReport(command=self.name or "index")
                report.finish("failed", 2, f"usage error: {exc.format_message()}")
                write_report(report, path)
                if as_json and path != "-":
                    write_report(report, "-")
            raise

    def _report_flags(self, ctx: click.Context, args: list[str]) -> tuple[str | None, bool]:
        """``(--json-report's value, --json given)`` as click reads the arguments (the last value wins, nothing after
        ``--``, an unknown flag skipped); where the arguments cannot be split (a flag without its value), the same
        rules over the words themselves."""
        parser = self.make_parser(ctx)
        parser.ignore_unknown_options = True
        try:
            opts, _, _ = parser.parse_args(list(args))
            path = opts.get("json_report")
            return (None if path is None else str(path)), bool(opts.get("as_json"))
        except click.UsageError:
            pass
        words = args[:args.index("--")] if "--" in args else args
        path = None
        for i, word in enumerate(words):
            if word == "--json-report" and i + 1 < len(words):
                path = words[i + 1]
            elif word.startswith("--json-report="):
                path = word.split("=", 1)[1]
        return path, "--json" in words


CLOSED_AT_START: set[str] = set()  # "stdout", "stderr": closed when the process started (cli/main.py puts /dev/null)


def require_stdout(command: str) -> None:
    """``PetalIOError`` (74) when the process started with stdout closed (``>&-``) and ``command`` writes its results
    there: they would go to /dev/null and the run exit 0, every answer lost in silence."""
    if "stdout" in CLOSED_AT_START:
        from petal.pipeline.reliability.errors import PetalIOError

        raise PetalIOError(f"stdout is closed (the process started without fd 1): {command} writes its results there; "
                           "give it a stdout (a file, a pipe)")


def device_options(func: F) -> F:
    """``--device``, ``--dtype``, ``--attention``; with ``--device cpu``, a combination the engine refuses is a usage
    error (2) before the command imports torch (``engine/config.device_problem``). A ``--vector-file`` query runs no
    model: its model flags are not checked. (``petal index`` judges them in its job, which writes the run's report;
    ``petal serve`` after its unused-flag check: ``device_flags``.)"""
    return device_flags(_device_checked(func))


def _device_checked(command: F) -> F:
    """``command``, refusing what ``device_problem`` refuses of its flags before it runs."""

    @functools.wraps(command)
    def checked(*args: Any, **kwargs: Any) -> Any:
        from petal.engine.config import device_problem

        device, dtype, attention = (kwargs.get(name) for name in ("device", "dtype", "attention"))
        if kwargs.get("vector_file") is None and isinstance(device, str) and isinstance(dtype, str) \
                and isinstance(attention, str):
            problem = device_problem(device, dtype, attention)
            if problem is not None:
                raise click.UsageError(problem)
        return command(*args, **kwargs)

    return cast(F, checked)


def device_flags(func: F) -> F:
    """``--device``, ``--dtype``, ``--attention``, unchecked (the command judges them)."""
    func = click.option("--attention", type=click.Choice(["auto", "flashinfer", "torch", "sdpa"]), default="auto",
                        show_default=True, help="Attention kernel (auto: FlashInfer on CUDA when it fits).")(func)
    func = click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
                        show_default=True, help="GEMM precision (auto: bfloat16 on CUDA, float32 on the CPU).")(func)
    func = click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                        help="Where the model runs.")(func)
    return func


def eprint(message: str) -> None:
    """One line on stderr (control characters escaped); a closed stderr is not an error of the run."""
    from petal.pipeline.reliability.errors import one_line

    with contextlib.suppress(BrokenPipeError, ValueError):
        print(one_line(message), file=sys.stderr, flush=True)


# NOTE: a flag given (on the command line, from the environment or a prompt) rather than left at its default
EXPLICIT = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.PROMPT)


def once_option(*decls: str, join: str, **kwargs: Any) -> Callable[[F], F]:
    """``click.option`` for a flag whose values a reader adds up (``--delete A --delete B``, ``--keep-columns``,
    ``--where``, the inputs ``petal embed --input`` and ``petal query --vector-file``): click keeps the last value of a
    repeated flag and drops the others without a word (the first file's ids stay indexed, a column is not kept, a
    filter is lost, the first file's texts or queries are never read), so a second one is a usage error (2) naming the
    flag and every value, and ``join``: how to give them at once. A flag that names one thing (an output: ``--out``,
    ``--output``, ``--json-report``; ``--model``, a column, a setting) keeps click's last value, as any Unix tool's
    option: nobody reads two of them as both."""

    def given_once(ctx: click.Context, param: click.Parameter, values: tuple[Any, ...]) -> Any:
        if len(values) > 1:
            from petal.pipeline.reliability.errors import quote_path

            raise click.BadParameter(f"given {len(values)} times ({', '.join(quote_path(v) for v in values)}): "
                                     f"click would keep only the last; {join}", ctx=ctx, param=param)
        return values[0] if values else None

    return click.option(*decls, multiple=True, callback=given_once, **kwargs)


def given_flags(names: tuple[str, ...]) -> list[str]:
    """The flags among ``names`` (parameter names) that the user gave (not defaults), as typed: ``--max-seqs``."""
    ctx = click.get_current_context()
    return [param.opts[0] for param in ctx.command.params
            if param.name in names and ctx.get_parameter_source(param.name) in EXPLICIT]


def unused_flags(flags: list[str], why: str, then: str) -> click.UsageError:
    """The usage error of ``flags`` that would set nothing in this run: ``why`` it has no part they set, ``then``
    what to do (``{them}``: it or them)."""
    one = len(flags) == 1
    return click.UsageError(f"{', '.join(flags)}: {why}, so {'this flag sets' if one else 'these flags set'} nothing "
                            f"here: {then.format(them='it' if one else 'them')}")
