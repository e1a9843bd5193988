"""petal's Python API: ``index``, ``rebuild``, ``open_index``, ``verify``, ``versions``, ``rollback`` (and ``Embedder``,
in ``jobs/embed.py``).

The CLI is written on these: each command parses its flags and calls one of them. Settings are
keyword arguments named like the CLI's flags (``pipeline/jobs/settings.py``). Failures raise the
``PetalError`` subclasses of ``pipeline/reliability/errors.py``, each with the ``exit_code`` the
command would end with; a run that raises still finishes its ``RunReport`` (and writes
``json_report``), and the exception carries it as ``.report``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import signal
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from petal.pipeline.config import check_column_name, keep_versions_problem
from petal.pipeline.jobs.report import RunReport
from petal.pipeline.jobs.settings import (
    check_vectors_flags,
    given_index_settings,
    index_job,
    index_settings,
    kind_of,
    not_empty_path,
    numpy_bool,
    out_path,
    unset_index_settings_dropped,
    whole_number,
)
from petal.pipeline.jobs.worker_start import leave_a_starting_worker
from petal.pipeline.reliability.errors import (
    FULL_RERUN,
    ArgumentTypeError,
    FlagError,
    Interrupted,
    OutputError,
    PetalError,
    PetalIOError,
    UsageError,
    arguments_named,
    keyword_named,
    one_line,
    quote_path,
    unknown_keyword,
    unmapped_error,
)
from petal.pipeline.reliability.notes import quiet_notes, say
from petal.pipeline.reliability.signals import StopSignals

if TYPE_CHECKING:
    from petal.pipeline.index.verify import VerifyReport
    from petal.pipeline.jobs.searcher import Index
    from petal.pipeline.jobs.versions import Rollback, VersionEntry
    from petal.pipeline.layout import OutputDir

Sources = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _quiet_when_asked(call: Callable[_P, _R]) -> Callable[_P, _R]:
    """``call`` with its notes and warnings sent to the ``petal`` logger, not stderr, when it is given ``quiet=True``
    (``notes.quiet_notes``; the CLI keeps them on stderr, ``notes_on_stderr``)."""
    @functools.wraps(call)
    def quietly(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        quiet = kwargs.get("quiet")
        # NOTE: numpy's True too (taken as a bool by the settings since e41f336; its notes still went to stderr)
        with quiet_notes(quiet is True or (numpy_bool(quiet) and bool(quiet))):
            return call(*args, **kwargs)
    return quietly


def _arguments_reported(command: str) -> Callable[[Callable[_P, RunReport]], Callable[_P, RunReport]]:
    """``index``/``rebuild`` with arguments Python does not bind to them (``out`` missing, a third positional)
    refused as their unknown settings are: an ``ArgumentTypeError`` (2, a ``TypeError``) carrying the failed report
    as ``.report``, ``json_report`` written (README: an error raised by index/rebuild carries the report)."""
    def report(refused: ArgumentTypeError, kwargs: dict[str, Any]) -> None:
        _fail(_own_report(kwargs.get("report"), command), refused, 2, f"usage error: {refused}",
              _report_path(kwargs.get("json_report")))
    return arguments_named(f"petal.{command}()", report)


def _keywords(call: Callable[..., Any]) -> list[str]:
    """The keyword-only parameters of ``call`` (``index``'s ``vectors_column``...): close matches of a typo too."""
    return [name for name, parameter in inspect.signature(call).parameters.items()
            if parameter.kind is parameter.KEYWORD_ONLY]


@_quiet_when_asked
@_arguments_reported("index")
def index(sources: Sources, out: str | os.PathLike[str], *, engine_factory: Callable[..., Any] | None = None,
          report: RunReport | None = None, stop: StopSignals | None = None, vectors_column: str | None = None,
          **settings: Any) -> RunReport:
    """Embed ``sources`` (Parquet files, directories, globs) and publish a FAISS index in ``out``.

    ``settings`` are ``petal index``'s flags as keywords (``model``, ``text_column``, ``id_column``,
    ``dim``, ``quantize``, ``index_memory="4G"``, ``max_bad_rows="1%"``, ``full``, ``sync``,
    ``max_removed="10%"``, ``delete="ids.parquet"``, ``keep_columns=["lang", "url"]``, ``json_report``,
    ``quiet``: no progress bar and nothing on stderr, the notes and warnings go to the ``petal`` logger, ...).
    ``vectors_column``: index the precomputed embeddings of that column (no model).
    An index setting not given or ``None`` (``index_factory``, ``metric``, ``index_memory``, ``target_recall``) keeps
    the live version's, as ``rebuild``'s: ``"auto"``, ``"ip"``, ``"8G"``, ``0.95`` for a first run.
    Returns the finished ``RunReport`` (``status`` success or nothing-to-do).
    ``engine_factory(spec, engine_config)`` replaces the engine (tests); ``stop``: an active
    ``StopSignals`` of the caller's (else SIGINT/SIGTERM are taken for the call, in the main thread, from its first
    line: the first stops the run, ``Interrupted``; the caller's handlers are back from then on, and as they were
    once the call ends. A ``KeyboardInterrupt`` that ends the run goes on to the caller with the report,
    ``interrupted``, as ``.report``).
    """
    leave_a_starting_worker()  # NOTE: a script's unguarded call, run again by a worker's spawn: worker_start.py
    given_report, report = report, _own_report(report, "index")
    with _stop_signals(stop) as active:  # NOTE: before the heavy imports below (index_run: ~1.5 s), as the CLI's
        try:
            _check_hooks("petal.index()", given_report, stop, engine_factory)
            not_empty_path(out, "out")
            settings = unset_index_settings_dropped(settings)
            job = index_job(sources, out, "petal.index()", _keywords(index), **settings)
            given = given_index_settings(settings)  # the others keep the live version's (first run: the defaults)
            if "" in job.sources:
                not_empty_path("", "sources")
            if vectors_column is not None:
                if not isinstance(vectors_column, str):
                    raise ArgumentTypeError(f"petal.index(): vectors_column={vectors_column!r} is "
                                            f"{kind_of(vectors_column)}, not str")
                if not vectors_column:  # NOTE: as --text-column "": no column has that name
                    raise UsageError("--vectors-column must not be empty")
                try:
                    check_column_name("--vectors-column", vectors_column)
                except ValueError as exc:
                    raise UsageError(str(exc)) from None
                check_vectors_flags(settings)
        except UsageError as exc:
            keyword_named(exc)  # NOTE: dim 0 < 1, not --dim: the caller passed keywords (the CLI keeps its flags)
            _fail(report, exc, 2, f"usage error: {exc}", _report_path(settings.get("json_report")))
            raise
        rerun = FULL_RERUN if job.full else "rerun"
        if vectors_column is not None:
            from petal.pipeline.jobs.vector_run import run_vector_index

            column = vectors_column
            return _run(lambda: run_vector_index(job, column, report, stop=active, given=given), report,
                        job.json_report, (job.out, job.json_report), active, rerun)
        from petal.pipeline.jobs.index_run import run_index

        hooks = {"engine_factory": engine_factory} if engine_factory is not None else {}
        return _run(lambda: run_index(job, report, stop=active, given=given, **hooks), report, job.json_report,
                    (job.out, job.json_report), active, rerun)


@_quiet_when_asked
@_arguments_reported("rebuild")
def rebuild(out: str | os.PathLike[str], *, json_report: str | os.PathLike[str] | None = None,
            report: RunReport | None = None, wait: bool = False, stop: StopSignals | None = None,
            keep_versions: int = 2, quiet: bool = False, **settings: Any) -> RunReport:
    """A new version of ``out``'s index from its stored embeddings with other index settings (no model).

    ``settings``: ``index_factory``, ``metric``, ``index_memory``, ``target_recall``; one not given (or ``None``) keeps
    the live version's (its manifest's: an ``IVF4096,Flat`` asked for stays one, ``index_factory="auto"`` chooses by
    size again). ``wait``: queue behind another writer of ``out`` (else exit 75); ``stop``: an active ``StopSignals`` of
    the caller's (else SIGINT/SIGTERM are taken for the call, as ``index`` takes them); ``keep_versions``: the versions
    left after the publish (the live one and N-1 before it, as ``index``'s); ``quiet``: its notes and warnings go to the
    ``petal`` logger, not stderr (as ``index``'s).
    """
    leave_a_starting_worker()  # as index's
    given_report, report = report, _own_report(report, "rebuild")
    target = _report_path(json_report)
    with _stop_signals(stop) as active:  # NOTE: before the heavy import below (FAISS, Arrow: ~1 s), as the CLI's
        try:
            _check_hooks("petal.rebuild()", given_report, stop)
            if json_report is not None:
                out_path(json_report, "json_report")
            for name, flag in (("wait", wait), ("quiet", quiet)):
                if not isinstance(flag, bool) and not numpy_bool(flag):
                    raise ArgumentTypeError(f"petal.rebuild(): {name}={flag!r} is {kind_of(flag)}, not bool")
            wait, quiet = bool(wait), bool(quiet)
            keep_versions = whole_number(keep_versions, "keep_versions")
            if (problem := keep_versions_problem(keep_versions)) is not None:
                raise UsageError(problem)  # NOTE: as petal index words it (keyword_named: keep_versions 0 < 1)
            not_empty_path(out, "out")
            out = out_path(out)
            settings = unset_index_settings_dropped(settings)
            chosen = index_settings("petal.rebuild()", _keywords(rebuild), **settings)
            given = given_index_settings(settings)
        except UsageError as exc:
            keyword_named(exc)
            _fail(report, exc, 2, f"usage error: {exc}", target)
            raise
        from petal.pipeline.jobs.rebuild import run_rebuild  # NOTE: after the flags: a usage error loads no FAISS/Arrow
        return _run(lambda: run_rebuild(out, chosen, report, wait=wait, stop=active, given=given, json_report=target,
                                        keep_versions=keep_versions), report, target, (out, target), active)


@arguments_named("petal.open_index()")
def open_index(path: str | os.PathLike[str], **settings: Any) -> Index:
    """A published index (an output directory or a version directory), ready to search.

    ``settings``: ``model`` (if it moved), ``device``, ``dtype``, ``attention``, ``nprobe``, ``rescore``,
    ``query_prompt``, ``allow_pickle_weights``. The model loads on the first search by text; its settings are
    judged here, before the index opens (one of the wrong type or not a choice: ``UsageError`` naming it).
    """
    from petal.pipeline.jobs.searcher import Index

    # NOTE: named as the caller called it: a typo (nprob=3) was "Index.__init__() got an unexpected keyword argument"
    taken = {name for name in inspect.signature(Index).parameters if name != "path" and not name.startswith("_")}
    unknown = next((key for key in settings if key not in taken), None)
    if unknown is not None:
        raise unknown_keyword("petal.open_index()", unknown, taken)
    return Index(path, _caller="petal.open_index()", **settings)


@arguments_named("petal.verify()")
def verify(out: str | os.PathLike[str], *, version: str | None = None) -> VerifyReport:
    """``petal verify OUT [--version V]``: every byte of ``out``'s live version (``version``: the version of that id
    under ``out/versions``) against the sha256 its manifest records, the manifest's own checksum, then ``index.faiss``
    and ``ids.parquet`` read as opening and searches read them. Reads only; the version is leased while it is read
    (a publish meanwhile does not prune it).

    Returns the ``VerifyReport`` (``ok``, ``version``, ``version_dir``, ``files``: one ``FileVerdict`` per file) when
    every file matches. A version that does not raises ``BadInputError`` (65) naming each file, or ``ConfigError``
    (78) when a listed file is missing or refused, as the command exits; the exception carries the report as
    ``.verify_report``. ``out`` holding no index, or no version ``version``: ``ConfigError`` (78); a file petal may
    not read: ``NoInputError`` (66); ``version`` not a version id (``vNNNNNN-YYYYMMDDTHHMMSSZ``): ``UsageError``.
    """
    from petal.pipeline.layout import OutputDir
    from petal.pipeline.reliability.errors import BadInputError, ConfigError, io_error, out_of_memory

    not_empty_path(out, "out")
    out = out_path(out)
    _check_version_id("petal.verify()", version)
    from petal.pipeline.index.verify import open_leased, verify_version

    try:
        target = out if version is None else _version_to_check(OutputDir(out), version)
        version_dir, _, lease = open_leased(target)
        with lease:  # NOTE: a publish meanwhile must not prune the version under the check
            report = verify_version(version_dir, read_index=True)
    except PetalError as exc:
        keyword_named(exc)
        raise
    except OSError as exc:  # as petal verify maps it: it writes nothing, so permission denied is 66
        raise io_error(exc, []) from exc
    except MemoryError as exc:
        raise out_of_memory(exc) from exc
    if report.ok:
        return report
    bad = [f"{f.name} ({f.problem})" for f in report.files if not f.ok]
    if report.manifest_checksum not in ("ok", "absent"):
        bad.insert(0, f"manifest.json ({report.manifest_checksum})")
    what = "missing, refused or not matching" if any(f.refused for f in report.files) else "do not match"
    message = f"{version_dir}: {len(bad)} file(s) {what}: " + "; ".join(bad)
    error = ConfigError(message) if report.exit_code == ConfigError.exit_code else BadInputError(message)
    error.verify_report = report
    raise error


@arguments_named("petal.versions()")
def versions(out: str | os.PathLike[str]) -> list[VersionEntry]:
    """``petal versions OUT``: the versions in ``out/versions``, newest first, one ``VersionEntry`` each (a frozen
    dataclass: ``version``, the id; ``live``, whether ``CURRENT`` names it; ``created_at``, ``num_vectors``,
    ``factory`` from its manifest; ``problem``, why it is no whole version (its manifest does not read, or records
    another id: ``created_at``/``num_vectors``/``factory`` are then ``None`` or what it records), ``None`` for a whole
    one; ``as_dict()``, the command's ``--json`` object). Only manifests are read (``rollback`` checks a version's
    files too); no entry ``live``: ``CURRENT`` names no version (``petal.open_index`` says why; ``rollback`` with a
    ``version`` repairs it). Reads only, takes no lock.

    ``out`` holding no index (missing, no ``versions/``) or a version directory given for it: ``ConfigError`` (78);
    one petal may not read: ``NoInputError`` (66); ``out`` not a path, ``""`` or another URL than ``file://``:
    ``UsageError`` (2) naming ``out``.
    """
    from petal.pipeline.jobs.versions import list_versions
    from petal.pipeline.reliability.errors import io_error, out_of_memory

    not_empty_path(out, "out")
    out = out_path(out)
    try:
        entries, _ = list_versions(out)  # NOTE: why CURRENT names no version is the CLI's warning: no entry live here
    except PetalError as exc:
        keyword_named(exc)
        raise
    except OSError as exc:  # as petal versions maps it (it writes nothing): permission denied is 66
        raise io_error(exc, []) from exc
    except MemoryError as exc:
        raise out_of_memory(exc) from exc
    return entries


@_quiet_when_asked
@arguments_named("petal.rollback()")
def rollback(out: str | os.PathLike[str], version: str | None = None, *, wait: bool = False,
             stop: StopSignals | None = None, quiet: bool = False) -> Rollback:
    """``petal rollback OUT [VERSION]``: make ``version`` ``out``'s live version (default: the newest whole version
    older than the live one). Any version on disk, older or newer than the live one (a roll forward); it must pass
    the checks opening it makes (its manifest reads and records ``version``, its files are there and match their
    sizes and head/tail checksums), then ``CURRENT`` is swapped in one rename, as a publish swaps it. The next
    ``index``/``rebuild`` starts from it; an ``Index`` open before keeps serving the version it opened (open it again).

    Returns a ``Rollback`` (a frozen dataclass: ``out``, the output directory; ``previous``, what ``CURRENT`` held,
    a version id, or its text when it named none; ``version``, live now; ``changed``, ``False`` when ``version`` was
    live already and nothing changed).

    Under the writer lock: held by another writer (a ``petal index``/``rebuild`` run), ``TemporaryFailure`` (75) as
    ``rebuild`` raises it, or with ``wait=True`` queue for it. ``stop``, ``quiet``: as ``rebuild``'s (SIGINT/SIGTERM
    taken for the call in the main thread, the first one while waiting for the lock: ``Interrupted``, nothing
    changed; ``quiet``: the note that it waits goes to the ``petal`` logger, not stderr). ``version`` not in
    ``out/versions`` (pruned, never made) or no whole version, or no whole version older than the live one to go back
    to: ``ConfigError`` (78) naming it and why, with the whole versions there; ``version`` no version id
    (``vNNNNNN-YYYYMMDDTHHMMSSZ``): ``UsageError`` (2); ``out`` holding no index (missing, no ``versions/``):
    ``ConfigError`` (78); one petal may not read: ``NoInputError`` (66), may not write: ``OutputError`` (73).
    """
    from petal.pipeline.reliability.errors import io_error, out_of_memory

    with _stop_signals(stop) as active:  # NOTE: from the first line, as rebuild's: a Ctrl-C while it waits stops it
        try:
            _check_hooks("petal.rollback()", None, stop)
            for name, flag in (("wait", wait), ("quiet", quiet)):
                if not isinstance(flag, bool) and not numpy_bool(flag):
                    raise ArgumentTypeError(f"petal.rollback(): {name}={flag!r} is {kind_of(flag)}, not bool")
            not_empty_path(out, "out")
            out = out_path(out)
            _check_version_id("petal.rollback()", version)
            from petal.pipeline.jobs.versions import rollback as make_live

            return make_live(out, version, wait=bool(wait), check=active.check)
        except PetalError as exc:
            keyword_named(exc)  # NOTE: "--wait queues" said to a caller who passes wait=True
            raise
        except OSError as exc:  # as petal rollback maps it
            raise io_error(exc, []) from exc
        except MemoryError as exc:
            raise out_of_memory(exc) from exc


def _check_version_id(caller: str, version: Any) -> None:
    """``version`` (``None``: not given) a version id, else ``UsageError`` (2) saying what it takes, named as the
    keyword (a ``TypeError`` too when it is no str)."""
    if version is None:
        return
    if not isinstance(version, str):
        raise ArgumentTypeError(f"{caller}: version={version!r} is {kind_of(version)}, not str")
    problem = version_id_problem(version)
    if problem is not None:
        refused = UsageError(f"version {problem}")
        keyword_named(refused)  # NOTE: its hint names the keyword (version=...), not --version
        raise refused


def version_id_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a version id (``None``: it is one); a path to a version directory
    (``OUT/versions/v...``, what ``ls`` shows) names the id to give instead."""
    from petal.pipeline.layout import VERSION_RE
    from petal.pipeline.reliability.errors import quote_text

    if VERSION_RE.match(value):
        return None
    name = os.path.basename(value.rstrip("/"))
    hint = f"; give its id: --version {name}" if VERSION_RE.match(name) else ""
    return (f"{quote_text(value, 80)} is not a version id (vNNNNNN-YYYYMMDDTHHMMSSZ, a directory name under "
            f"OUT/versions){hint}")


def _version_to_check(out: OutputDir, version: str) -> Path:
    """What ``petal verify OUT --version V`` opens: ``out.root`` itself when ``V`` is the live version (a damaged one
    then says how to go back), else ``OUT/versions/V``; ``ConfigError`` (78) when that is no version of OUT, saying why.

    NOTE: was one message for all, "OUT/versions/V is not a version of OUT (no manifest.json)": of a version directory
    given as OUT (a path under it that never existed), and of a version pruned or never made (no directory at all),
    naming none of the versions there."""
    from petal.pipeline.layout import MAX_LISTED_VERSIONS, denied, is_denied, is_output_dir, not_an_index
    from petal.pipeline.manifest import MANIFEST_FILE
    from petal.pipeline.reliability.errors import ConfigError

    root = out.root
    if os.path.lexists(root / MANIFEST_FILE):  # NOTE: as resolve_index_dir tells a version directory
        holder = root.parent.parent
        give = (f"petal verify {quote_path(holder)} --version {version}" if root.parent.name == "versions"
                and is_output_dir(holder) else f"the output directory that holds it (the one with CURRENT) and "
                f"--version {version}")
        raise ConfigError(f"{quote_path(root)} is a version directory, not an output directory: --version picks a "
                          f"version under OUT/versions; give {give} (or petal verify {quote_path(root)} to check "
                          "this version alone)")
    live = _live(out)
    if version == live:
        return root
    if not is_output_dir(root):
        raise not_an_index(root)
    target = out.version_dir(version)
    # NOTE: lexists: a manifest.json that is there but no regular file (a directory, a FIFO, a link out) is refused by
    # resolve_index_dir naming what it is, not said to be missing
    if os.path.lexists(target / MANIFEST_FILE):
        return target
    if os.path.lexists(target):
        raise ConfigError(f"--version {version}: {quote_path(target)} is not a version of {quote_path(root)} "
                          "(no manifest.json)")
    try:
        present = out.versions()
    except OSError as exc:
        if is_denied(exc):
            raise denied(out.versions_dir) from exc
        raise
    # NOTE: as many as CURRENT's recovery hint offers
    newest = ", ".join(present[-MAX_LISTED_VERSIONS:])
    there = "it holds none" if not present else f"the versions there: {newest}" \
        if len(present) <= MAX_LISTED_VERSIONS else \
        f"the newest {MAX_LISTED_VERSIONS} of the {len(present)} there: {newest}"
    shown_live = f"; live: {live}" if live is not None else ""
    raise ConfigError(f"--version {version} is not in {quote_path(out.versions_dir)} (pruned, or never made); "
                      f"{there}{shown_live}")



def _live(out: Any) -> str | None:
    """The version CURRENT names (``None`` without a readable pointer: a ``version`` given is then checked by
    itself)."""
    try:
        live: str | None = out.current_version()
    except PetalError:
        return None
    return live


def _own_report(report: Any, command: str) -> RunReport:
    """``report`` when it is a ``RunReport``, else a new one (the one a wrong ``report`` argument fails in)."""
    return report if isinstance(report, RunReport) else RunReport(command=command)


def _check_hooks(caller: str, report: Any, stop: Any, engine_factory: Any = None) -> None:
    """``UsageError`` naming ``report``, ``stop`` or ``engine_factory`` when it is not what the run calls (before: an
    ``AttributeError``, ``'str' object has no attribute 'finish'``, or a ``TypeError`` from inside the run, once
    ``OUT`` was made)."""
    if report is not None and not isinstance(report, RunReport):
        raise ArgumentTypeError(f"{caller}: report={report!r} is {kind_of(report)}, not a petal.RunReport (or None)")
    if stop is not None:
        from petal.pipeline.reliability.signals import StopSignals

        if not isinstance(stop, StopSignals):
            raise ArgumentTypeError(f"{caller}: stop={stop!r} is {kind_of(stop)}, not a StopSignals "
                             "(petal.pipeline.reliability.signals) or None")
    if engine_factory is not None and not callable(engine_factory):
        raise ArgumentTypeError(f"{caller}: engine_factory={engine_factory!r} is {kind_of(engine_factory)}, "
                                "not callable")


def _report_path(json_report: Any) -> Path | None:
    """``json_report`` as the path to write the report to (a ``file://`` URL the local path it names, as ``out_path``
    converts it); ``None`` when not given or not a path (a ``UsageError`` names it where it is judged).

    NOTE: was ``Path(json_report)``: the report of a run refused for another argument was written to ``./file:/r.json``
    or ``./s3:/b/r.json``."""
    if not isinstance(json_report, (str, os.PathLike)) or not os.fspath(json_report):
        return None  # NOTE: "" is no path (never Path("") = "."): out_path names it
    try:
        return out_path(json_report, "json_report")
    except UsageError:  # NOTE: another URL (s3://b/r.json) is no path to write a report to: out_path names it
        return None


def _stop_signals(stop: Any) -> contextlib.AbstractContextManager[Any]:
    """The caller's ``stop`` as it is (one of the wrong type: ``_check_hooks`` refuses it), else SIGINT and SIGTERM
    taken for the call (``StopSignals.for_caller``: the caller's handlers are back from the first signal on, and
    every handler is as it was when the call returns)."""
    return contextlib.nullcontext(stop) if stop is not None else StopSignals.for_caller()


def _stopped_by(exc: BaseException, stop: StopSignals | None) -> int | None:
    """The signal that ``exc`` (no ``PetalError``) ending a run stands for, ``None`` for none (a bug).

    A ``KeyboardInterrupt`` is SIGINT's (the caller's handler, back after petal's first signal: a second Ctrl-C; or
    the ``petal`` script's ``StopSignal``, which names its own); another exception that is no ``Exception``
    (``SystemExit`` from a worker framework's SIGTERM handler) raised once a stop signal came is that signal's.
    NOTE: was 'failed', exit 1, 'internal error: KeyboardInterrupt()': a Ctrl-C is no bug, and the run left
    what any stop leaves (committed shards kept, the lock released)."""
    if isinstance(exc, KeyboardInterrupt):
        signum: int = getattr(exc, "signum", None) or signal.SIGINT
        return signum
    if not isinstance(exc, Exception) and stop is not None:
        return stop.signum
    return None


def _run(work: Callable[[], RunReport], report: RunReport, json_report: Path | str | None,
         outputs: Iterable[Path | str | None], stop: StopSignals | None = None, rerun: str = "rerun") -> RunReport:
    """``work()``, its error mapped to the contract and the report finished and written. ``outputs``: the paths the
    run writes (``OUT``, the report; ``None`` for one not given): permission denied that nothing mapped on a path
    inside one is 73, on any other path (a source, a model file) 66. ``stop``: the run's ``StopSignals``; ``rerun``:
    what resumes a stopped run (``Interrupted``'s)."""
    try:
        try:
            work()
        except BrokenPipeError:
            raise  # stdout's reader went away: the CLI ends quietly (141)
        except (OSError, MemoryError, ValueError) as exc:
            # an OSError nothing mapped: 74 naming the file (73/66: permission denied); a host MemoryError no read
            # path named (a build, a merge): 74, not a bug; a model's error: 78.
            # NOTE: no ValueError inside a run becomes a usage error: flags are judged by their parsing and
            # by FlagError (2); any ValueError but a model's is a bug (1).
            mapped = unmapped_error(exc, [path for path in outputs if path is not None and str(path) != "-"])
            if mapped is None or mapped is exc:
                raise
            raise mapped from exc
    except PetalError as exc:
        keyword_named(exc)
        _fail(report, exc, exc.exit_code,
              f"usage error: {exc}" if isinstance(exc, UsageError) and not isinstance(exc, FlagError) else str(exc),
              json_report, exc.status)
        raise
    except BaseException as exc:
        signum = _stopped_by(exc, stop)
        if signum is None:
            _fail(report, exc, 1, f"internal error: {exc!r}", json_report)
            raise
        # NOTE: the caller's own exception goes on (its KeyboardInterrupt stays one: an `except Exception` of its own
        # must not swallow a second Ctrl-C); what it ended is reported as any stop, and it carries the report too
        stopped = Interrupted(signum, live_version=report.version, rerun=rerun)
        _fail(report, exc, stopped.exit_code, f"{stopped} ({type(exc).__name__})", json_report, stopped.status)
        with contextlib.suppress(AttributeError):  # NOTE: an exception class with __slots__ takes no report
            exc.report = report  # type: ignore[attr-defined]
        raise
    unwritten = report_error(report, json_report)
    if unwritten is not None:  # NOTE: was a warning and exit 0: a cron job lost its report without a sign
        raise report_missing(report, unwritten)
    return report


def report_missing(report: RunReport, unwritten: PetalError) -> PetalError:
    """``unwritten`` (the report of a run that did its work could not be written: to a file, to stdout) saying what
    the run did, and ``report`` finished with its code."""
    done = (f"version {report.version} is published and live" if report.version and report.status == "success"
            else f"the live version {report.version} stays" if report.version else "nothing was published")
    late = type(unwritten)(f"{unwritten}; {done}, only the report is missing")
    report.finish(report.status, late.exit_code, str(late))
    late.report = report
    return late


def _fail(report: RunReport, exc: BaseException, exit_code: int, message: str, json_report: Any,
          status: str = "failed") -> None:
    report.finish(status, exit_code, message)
    from petal.pipeline.jobs.report_file import ReportOverInput

    write_report(report, None if isinstance(exc, ReportOverInput) else json_report)  # NOTE: never over an input
    if isinstance(exc, PetalError):
        exc.report = report


def write_report(report: RunReport, json_report: Path | str | None) -> None:
    """Write the report if asked, for a run that failed already: a report that cannot be written is a warning (the
    exit code stays the run's)."""
    if json_report is None:
        return
    try:
        report.write(Path(json_report))
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        say(f"warning: cannot write the report to {quote_path(json_report)}: {reason}")


def stdout_report_error(exc: OSError) -> PetalIOError:
    """The report (``--json``, ``--json-report -``) that stdout refused (a full disk, ``/dev/full``): 74, naming
    stdout."""
    return PetalIOError(f"cannot write the report to stdout: {exc.strerror or exc}")


def report_error(report: RunReport, json_report: Path | str | None) -> PetalError | None:
    """Write the report of a run that did its work, if asked; the error when it could not be written (checked before
    the run, ``check_report_file``; what only shows now: a full disk, a directory removed or made read-only): 73 when
    petal may not write there, else 74, naming the path (``write_error``)."""
    from petal.pipeline.jobs.report_file import STDOUT
    from petal.pipeline.reliability.output_file import write_error

    if json_report is None:
        return None
    try:
        report.write(Path(json_report))
    except BrokenPipeError:
        raise  # --json-report -: stdout's reader went away (the CLI ends quietly, 141)
    except OSError as exc:
        if str(json_report) == STDOUT:  # NOTE: its OSError names no file: '-' is stdout
            return stdout_report_error(exc)
        return write_error(Path(json_report), exc, "--json-report")
    except ValueError as exc:  # a file of an output directory (refused before the run; made one since)
        return OutputError(f"cannot create --json-report {quote_path(json_report)}: {one_line(str(exc))}")
    return None
