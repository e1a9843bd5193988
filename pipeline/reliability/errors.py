"""Errors a user can act on, each with the process exit code it maps to (the cron/Airflow contract).

| code | meaning |
|---|---|
| 0 | success (also: nothing to do) |
| 1 | internal error (a bug: traceback is printed) |
| 2 | usage error (bad flags) |
| 65 | bad input data (corrupt shard, wrong column type, too many bad rows) |
| 66 | no input (no shards, no rows) |
| 73 | cannot create output |
| 74 | I/O error (disk full, read error after retries) |
| 75 | temporary failure, safe to retry (output locked, CUDA error that needs a new process) |
| 78 | configuration error (model missing or unsafe, settings differ from the index being resumed) |
| 129 / 130 / 143 | interrupted by SIGHUP / SIGINT / SIGTERM (finished work kept, resumable); 138/140 SIGUSR1/2 |
| 141 | stdout closed by its reader (``petal query ... | head -1``): ended quietly, as Unix tools do |

Every message that embeds a path or a string from the user quotes it with ``quote_path`` /
``quote_text``, so a message is always one line (a file name holding a newline cannot forge the
last stderr line) and never carries more than a short, escaped prefix of a file's content.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import functools
import inspect
import os
import re
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

if TYPE_CHECKING:
    from petal.pipeline.index.verify import VerifyReport
    from petal.pipeline.jobs.report import RunReport

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_DATAERR = 65
EXIT_NOINPUT = 66
EXIT_CANTCREAT = 73
EXIT_IOERR = 74
DENIED = (errno.EACCES, errno.EPERM)  # permission denied: never retried, never an I/O error
EXIT_TEMPFAIL = 75
EXIT_CONFIG = 78
EXIT_SIGINT = 130
EXIT_SIGTERM = 143
EXIT_SIGPIPE = 141  # 128 + SIGPIPE: what a shell reports for a Unix tool whose reader went away
EXIT_SIGNAL_BASE = 128  # a handled signal N ends the run with 128 + N (SIGHUP 129, SIGINT 130, SIGTERM 143)

SAFE_PATH = re.compile(r"^[\w@%+=:,./~-]+$", re.ASCII)
QUOTE_TEXT_CHARS = 60


def _escape(text: str) -> str:
    out = []
    for ch in text:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch.isprintable() and not ("\udc80" <= ch <= "\udcff"):
            out.append(ch)
        elif "\udc80" <= ch <= "\udcff":  # a byte that is not UTF-8 (surrogateescape)
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def quote_names(names: Iterable[str]) -> str:
    """Column names for a message, each quoted (``'id', 'body'``; ``none``): a bare list was ambiguous for a name
    ``''``, `` sp `` or ``a,b``."""
    return ", ".join(repr(name) for name in names) or "none"


def quote_path(path: object) -> str:
    """``path`` for a message: as is when it is plain (letters, digits, ``/._-``...), else in double
    quotes with backslash escapes for quotes, control characters, newlines and bytes that are not
    UTF-8. The result is always one printable line. Anything else (an object's ``RemotePath``) is
    quoted as its ``str()``."""
    if path is None:
        return '""'
    text = os.fsdecode(path) if isinstance(path, bytes) else str(path)
    if SAFE_PATH.match(text):
        return text
    return '"' + _escape(text) + '"'


def quote_text(text: object, limit: int = QUOTE_TEXT_CHARS) -> str:
    """A user's string (or the start of a file's content) for a message: quoted, escaped, one line,
    at most ``limit`` characters of it (``...`` marks a cut)."""
    value = text.decode("utf-8", "surrogateescape") if isinstance(text, bytes) else str(text)
    cut = len(value) > limit
    return '"' + _escape(value[:limit]) + ('..."' if cut else '"')


def one_line(message: str) -> str:
    """The last guard before a line reaches stderr: control characters (newlines above all) escaped."""
    if message.isprintable():
        return message
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for ch in message)


class PetalError(Exception):
    """A failure explained to the user (no traceback), ending the process with ``exit_code``."""

    exit_code = EXIT_INTERNAL
    status = "failed"
    report: RunReport | None = None  # the finished report of the run it ended (Python API: index, rebuild)
    verify_report: VerifyReport | None = None  # petal.verify()'s report of the version it found damaged


class UsageError(PetalError, ValueError):
    """A bad argument or setting (the CLI's usage error, exit 2); also a ``ValueError`` for Python callers."""

    exit_code = EXIT_USAGE


class BadInputError(PetalError):
    """Bad input data: a corrupt shard or file, a column of the wrong type, too many bad rows (exit 65)."""

    exit_code = EXIT_DATAERR


class NoInputError(PetalError):
    """No input: no shards, no rows, nothing to embed or query, a file that is missing or unreadable (exit 66)."""

    exit_code = EXIT_NOINPUT


class OutputError(PetalError):
    """An output that cannot be created: a directory petal may not write, a path that is not one (exit 73)."""

    exit_code = EXIT_CANTCREAT


class PetalIOError(PetalError):
    """Disk full, a read-only or failing disk, a read error that outlived its retries (exit 74)."""

    exit_code = EXIT_IOERR


class StdoutError(OSError):
    """A write to stdout that failed for another reason than a closed pipe (``> FILE`` on a full or failing disk,
    ``/dev/full``): the ``OSError`` of fd 1 carries no file name, so the ``petal`` script's stdout raises this one
    (``cli/main.py``), said as "cannot write the output to stdout" wherever it surfaces (``io_error``)."""


class TemporaryFailure(PetalError):
    """A failure a retry can cure: the output locked by another writer, a version pruned while opened, a CUDA
    error that needs a new process (exit 75)."""

    exit_code = EXIT_TEMPFAIL


class ConfigError(PetalError):
    """A configuration error: a model missing, unsafe or not the index's, settings that differ from the index
    being resumed, a path that holds no index, a damaged manifest (exit 78)."""

    exit_code = EXIT_CONFIG


class FlagError(UsageError):
    """A flag's value that only the run can judge (a FAISS factory against the vectors it would get,
    a token budget against the model's length, ``--device cuda`` without CUDA): exit 2, the message
    names the flag. Any other ``ValueError`` inside a run is not a usage error.

    A ``UsageError`` for Python callers (``except petal.UsageError`` catches ``dim=`` above the model's
    width); the CLI prints it as a run's error (``petal: ...``), not with click's usage banner."""



class ArgumentTypeError(UsageError, TypeError):
    """An argument of the wrong type (``k="3"``, ``queries=5``, a torch tensor of numbers as ``texts``): a
    ``UsageError`` (exit 2) and a ``TypeError``, as Python callers expect of one; the message names the argument
    and the types it takes."""


def unknown_keyword(caller: str, key: str, known: Iterable[str]) -> ArgumentTypeError:
    """Python's words for a keyword ``caller`` does not take (``petal.index() got an unexpected keyword argument
    'modle'``) as an ``ArgumentTypeError``: exit 2 and the run's report for the API's runs, still a ``TypeError``;
    with the close matches among the ``known`` keywords (``; did you mean 'model'?``)."""
    close = difflib.get_close_matches(key, sorted(set(known)), n=3) if isinstance(key, str) else []
    hint = f"; did you mean {' or '.join(repr(name) for name in close)}?" if close else ""
    return ArgumentTypeError(f"{caller} got an unexpected keyword argument {key!r}{hint}")


_P = ParamSpec("_P")
_R = TypeVar("_R")
_UNEXPECTED = re.compile(r"got an unexpected keyword argument '([^']*)'")


def binding_error(exc: TypeError, call: Callable[..., object], caller: str, args: tuple[object, ...],
                  kwargs: dict[str, object], known: Iterable[str] = ()) -> ArgumentTypeError | None:
    """The ``ArgumentTypeError`` for ``exc`` when it is Python's own refusal of the arguments of ``call(*args,
    **kwargs)`` (an unknown keyword, a missing or extra argument), named as ``caller`` (``petal.Embedder()``, not
    ``Embedder.__init__()``); ``None`` when the arguments bind (``exc`` came from inside the call). ``known``:
    keywords beside ``call``'s own parameters, for the close matches."""
    signature = inspect.signature(call)
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        pass
    else:
        return None
    taken = [name for name, parameter in signature.parameters.items() if not name.startswith("_")
             and name != "self" and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)]
    unexpected = _UNEXPECTED.search(str(exc))
    if unexpected is not None:
        return unknown_keyword(caller, unexpected.group(1), [*taken, *known])
    message = str(exc)
    own = f"{call.__qualname__}()"
    return ArgumentTypeError(caller + message[len(own):] if message.startswith(own) else f"{caller}: {message}")


def arguments_named(caller: str, refusing: Callable[[ArgumentTypeError, dict[str, Any]], None] | None = None,
                    ) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Around a public API function or method: arguments Python does not bind to it (``Embedder(devce="cpu")``,
    ``index.search()``) raise ``ArgumentTypeError`` (``UsageError``, exit 2, and still a ``TypeError``) named as
    ``caller``, with the close matches of an unknown keyword, as ``petal.index``'s unknown settings are;
    ``refusing(error, kwargs)``, if given, runs first (``petal.index``: its failed report written).
    NOTE: was Python's bare ``TypeError`` ('Embedder.__init__() got an unexpected keyword argument 'devce''), which
    ``except petal.PetalError`` (the README's Airflow task, no retry for a usage error) let through."""
    def wrap(call: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(call)
        def named(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return call(*args, **kwargs)
            except TypeError as exc:
                if isinstance(exc, PetalError):
                    raise
                refused = binding_error(exc, call, caller, args, kwargs)
                if refused is None:
                    raise
                if refusing is not None:
                    refusing(refused, kwargs)
                raise refused from None
        return named
    return wrap

# NOTE: messages are written with the CLI's flags (--dim, -k, --where); a Python caller passed keywords (dim=, k=,
# where=), so the API's entry points rename them (``keyword_names``) unless a CLI command runs them (``cli_names``)
_CLI_NAMES: ContextVar[bool] = ContextVar("petal_cli_names", default=False)
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-k|-q)(?![\w-])")
_CLI_HINT = re.compile(r"\bpetal [a-z]+ (?:\S+ )?\(?$")  # "petal index --keep-columns": the command's own flag
_FLAG_KEYWORDS = {"-k": "k", "-q": "quiet=True", "--quiet": "quiet=True", "--full": "full=True", "--sync": "sync=True",
                  "--wait": "wait=True", "--ray": "ray=True", "--allow-pickle-weights": "allow_pickle_weights=True",
                  "--no-cuda-graphs": "cuda_graphs=False", "--index-factory": "index_factory"}


@contextlib.contextmanager
def cli_names() -> Iterator[None]:
    """Around a CLI command: the API it calls keeps naming the command's flags."""
    token = _CLI_NAMES.set(True)
    try:
        yield
    finally:
        _CLI_NAMES.reset(token)


def keyword_message(message: str) -> str:
    """``message`` with each CLI flag it names as the Python API's keyword (``--dim 0 < 1``: ``dim 0 < 1``, ``-k``:
    ``k``, ``--full``: ``full=True``); a flag in a CLI hint (``petal index --keep-columns``) stays."""
    def keyword(match: re.Match[str]) -> str:
        flag = match.group()
        if _CLI_HINT.search(message, 0, match.start()):
            return flag
        return _FLAG_KEYWORDS.get(flag, flag[2:].replace("-", "_"))

    return _FLAG.sub(keyword, message)


def keyword_named(exc: BaseException) -> None:
    """``exc`` (a ``PetalError`` raised to a Python caller) renamed in place by ``keyword_message``; under
    ``cli_names`` (a CLI command) nothing changes."""
    if isinstance(exc, PetalError) and not _CLI_NAMES.get() and exc.args and isinstance(exc.args[0], str):
        exc.args = (keyword_message(exc.args[0]), *exc.args[1:])


@contextlib.contextmanager
def keyword_names() -> Iterator[None]:
    """Around a public API method: its ``PetalError`` names keywords, not flags (``keyword_named``)."""
    try:
        yield
    except PetalError as exc:
        keyword_named(exc)
        raise


@contextlib.contextmanager
def flag_errors() -> Iterator[None]:
    """Around code that only interprets flags (engine and device settings): its ``ValueError`` is a ``FlagError``."""
    try:
        yield
    except PetalError:
        raise
    except ValueError as exc:
        from petal.engine.errors import ModelError, ModelFlagError

        if isinstance(exc, ModelError) and not isinstance(exc, ModelFlagError):  # the model's own: 78, not a flag's
            raise ConfigError(one_line(str(exc))) from exc
        raise FlagError(one_line(str(exc))) from exc


def io_error(exc: OSError, outputs: Iterable[Path | str] | None = None) -> PetalError:
    """An ``OSError`` nothing mapped on its way up, as the ``PetalError`` of the contract: 74 naming the file
    (65 for a decoding error of pyarrow, which carries no errno). Permission denied (EACCES, EPERM) is no I/O
    error (a retry fails the same way): given the command's ``outputs`` (its output directories or files), on a
    path inside one it is 73, cannot create output, on any other path (one petal reads) 66, no input. Without
    ``outputs``, or without the path (pyarrow's errors carry none) when the command has outputs, the role is
    unknown and it stays 74 (an output's must never become 66)."""
    if isinstance(exc, StdoutError):
        return PetalIOError(f"cannot write the output to stdout: {exc.strerror or exc}")
    where = quote_path(exc.filename) if exc.filename else "a file"
    if exc.errno is None:
        return BadInputError(f"cannot read {where}: {one_line(str(exc))[:300]}")
    outputs = None if outputs is None else list(outputs)
    if exc.errno in DENIED and outputs is not None and (exc.filename or not outputs):
        if exc.filename and any(inside(exc.filename, out) for out in outputs):
            return OutputError(f"cannot create output: petal may not write {where} (permission denied); run as a "
                               "user who may write it, or fix its permissions")
        return NoInputError(f"{where}: petal may not read it (permission denied); run as a user who may read it, "
                            "or fix its permissions")
    return PetalIOError(f"I/O error on {where}: {exc.strerror or exc}")


def out_of_memory(exc: MemoryError) -> PetalIOError:
    """A host ``MemoryError`` nothing mapped on its way up (a read path names its file itself: read_errors.py), as
    the contract's 74: the host ran short, which is no bug (1) and no damage to the input."""
    detail = one_line(str(exc)).strip()[:160]
    return PetalIOError(f"out of host memory{f' ({detail})' if detail else ''}; free memory or ask for less (a "
                        "lower --token-budget or --index-memory, fewer workers), then run again: an index run resumes "
                        "from the shards it finished")


def unmapped_error(exc: BaseException, outputs: Iterable[Path | str] | None = None) -> PetalError | None:
    """The contract's ``PetalError`` of ``exc``, an exception nothing mapped on its way up: ``exc`` itself when it is
    one; an ``OSError`` as ``io_error`` (``outputs`` as there); a host ``MemoryError`` as ``out_of_memory``; a model's
    ``ModelError`` (weights gone or wrong) as a ``ConfigError`` (78), a flag it cannot take (``ModelFlagError``) as a
    ``FlagError`` (2). ``None`` for anything else: a bug (exit 1).
    Where the run goes on in another process (a worker, a Ray actor) this maps its error as the CLI would."""
    if isinstance(exc, PetalError):
        return exc
    if isinstance(exc, OSError):
        return io_error(exc, outputs)
    if isinstance(exc, MemoryError):
        return out_of_memory(exc)
    from petal.engine.errors import ModelError, ModelFlagError

    if isinstance(exc, ModelFlagError):
        return FlagError(one_line(str(exc)))
    if isinstance(exc, ModelError):
        return ConfigError(one_line(str(exc)))
    return None


def inside(path: object, root: Path | str) -> bool:
    """``path`` is ``root`` or below it, as given or with symlinks resolved (an OUT given through a link)."""
    try:
        target, base = os.fsdecode(path), os.fsdecode(root)  # type: ignore[arg-type]
        pairs = ((os.path.abspath(target), os.path.abspath(base)), (os.path.realpath(target), os.path.realpath(base)))
    except (TypeError, ValueError, OSError):
        return False
    return any(t == b or t.startswith(b.rstrip(os.sep) + os.sep) for t, b in pairs)


FULL_RERUN = "rerun with --full (and its other flags)"  # what resumes a stopped --full run (a plain rerun ends it)


class Interrupted(PetalError):
    """A clean stop after a signal (finished shards are committed): exit 128 + the signal's number."""

    status = "interrupted"

    def __init__(self, signum: int, live_version: str | None = None, rerun: str = "rerun",
                 cleaned: bool = False) -> None:
        """``live_version``: the signal came once the run had published it (it is live; ``cleaned``: its clean-up
        had finished, else it was cut).
        ``rerun``: what resumes it (``rerun with --full`` for a --full run: a plain rerun ends that run instead)."""
        import signal

        name = signal.Signals(signum).name
        self.live_version = live_version
        if live_version is None:
            super().__init__(f"interrupted by {name}; finished shards are committed, {rerun} to resume")
        elif cleaned:  # NOTE: the signal came during the clean-up, which had nothing left to check it for
            super().__init__(f"interrupted by {name} after version {live_version} went live (queries use it) and "
                             "old versions and store entries were pruned (the report's pruned)")
        else:  # NOTE: said the whole pruning was left while the report showed entries it had removed
            super().__init__(f"interrupted by {name} after version {live_version} went live (queries use it); "
                             "what was not pruned yet (old versions, store entries: the report's pruned says what "
                             "was) is left to the next run")
        self.signum = signum
        self.exit_code = EXIT_SIGNAL_BASE + signum


# NOTE: faiss reports a failed write as a RuntimeError ("write error in PATH: ... (No space left on
# device)", "could not open PATH for writing: ..."), not as an OSError.
FAISS_WRITE_ERRORS = ("write error in", "could not open")


@contextlib.contextmanager
def writing(path: Path | str) -> Iterator[None]:
    """An I/O error while writing ``path`` (disk full, read-only, failing disk) becomes exit 74 naming it."""
    try:
        yield
    except OSError as exc:
        if exc.errno in DENIED:  # NOTE: not an I/O error a retry or a disk fix cures: an output petal may not write
            raise OutputError(f"cannot create output: petal may not write {quote_path(exc.filename or path)} "
                              f"({exc.strerror or exc}); run as a user who may write it, or fix its "
                              "permissions") from exc
        raise PetalIOError(f"cannot write {quote_path(exc.filename or path)}: {exc.strerror or exc}") from exc
    except RuntimeError as exc:
        message = str(exc)
        marker = next((m for m in FAISS_WRITE_ERRORS if m in message), None)
        if marker is None:
            raise
        detail = one_line(message[message.index(marker):].strip())
        if "Permission denied" in detail:
            raise OutputError(f"cannot create output: petal may not write {quote_path(path)} (permission denied); "
                              "run as a user who may write it, or fix its permissions") from exc
        raise PetalIOError(f"cannot write {quote_path(path)}: {detail}") from exc
