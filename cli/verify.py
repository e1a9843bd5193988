"""``petal verify OUT``: every byte of a version checked against the checksums written with it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from petal.cli.common import PATH, PetalClickError, json_text, user_errors, write_stdout
from petal.cli.info import JsonFailureCommand, echo_json_failure

if TYPE_CHECKING:
    from petal.pipeline.layout import OutputDir


@click.command(cls=JsonFailureCommand)  # a usage error with --json: the object too
@click.argument("out", metavar="OUT", type=PATH)
@click.option("--version", "version", default=None, metavar="V", callback=lambda ctx, param, value: _version_id(value),
              help="Check version V (an id under OUT/versions, vNNNNNN-YYYYMMDDTHHMMSSZ; default: the live one).")
@click.option("--json", "as_json", is_flag=True, help="The result as one JSON object on stdout.")
@user_errors(outputs=())
def verify(out: Path, version: str | None, as_json: bool) -> None:
    """Check the full sha256 of every file of OUT's live version (or --version V) and the manifest's
    own checksum, then that the files hold what the manifest says: index.faiss read as opening reads it
    (its header's dim, vectors and metric, its index kind against the manifest's factory), and ids.parquet
    decoded as searches read it, as many ids as vectors. Exit 0 when all match, 65 naming each file that
    does not, 78 (as opening the version) when a listed file is missing or not a regular file inside the
    version, or when OUT holds no index or V no version; 66 when petal may not read a file of it; 2 when V
    is not a version id.

    Opening an index (petal query) checks sizes, head/tail checksums and index.faiss's header only, so
    that it costs O(1) in the index size; this command reads every byte.
    """
    from petal.pipeline.index.verify import open_leased, verify_version
    from petal.pipeline.layout import OutputDir
    from petal.pipeline.reliability.errors import ConfigError, PetalError, io_error, quote_path

    try:
        # NOTE: the live version named by --version is checked as OUT is: a damaged one says how to go back
        target = out if version is None or version == _live(OutputDir(out)) else OutputDir(out).version_dir(version)
        # NOTE: lexists: a manifest.json that is there but no regular file (a directory, a FIFO, a link out) is
        # refused by resolve_index_dir naming what it is, not said to be missing
        if target != out and not os.path.lexists(target / "manifest.json"):
            raise ConfigError(f"--version {version}: {target} is not a version of {out} (no manifest.json)")
        version_dir, _, lease = open_leased(target)
        with lease:  # NOTE: a publish meanwhile must not prune the version under the check
            report = verify_version(version_dir, read_index=True)
    except (PetalError, OSError) as exc:
        if as_json:  # NOTE: --json promises one object on stdout, whatever the verdict
            error = exc if isinstance(exc, PetalError) else io_error(exc, [])  # an OSError as user_errors maps it
            echo_json_failure(str(error), error.exit_code)
        raise
    if as_json:
        lines = [json_text(report.as_dict())]
    else:
        state = {"ok": "ok", "absent": "none recorded (written before petal verify existed)"}
        lines = [f"version   {quote_path(version_dir)}",
                 f"manifest  own checksum: {state.get(report.manifest_checksum, 'MISMATCH')}"]
        for f in report.files:
            label = "ok      " if f.ok else "REFUSED " if f.refused else "MISMATCH"
            lines.append(f"  {label}  {f.name}" + (f"  {f.problem}" if f.problem else ""))
    write_stdout(lines, flush=True)  # NOTE: a full stdout is 74 naming stdout
    if not report.ok:
        bad = [f"{f.name} ({f.problem})" for f in report.files if not f.ok]
        if report.manifest_checksum not in ("ok", "absent"):
            bad.insert(0, f"manifest.json ({report.manifest_checksum})")
        what = "missing, refused or not matching" if any(f.refused for f in report.files) else "do not match"
        raise PetalClickError(f"{version_dir}: {len(bad)} file(s) {what}: " + "; ".join(bad), report.exit_code)


def _version_id(value: str | None) -> str | None:
    """``--version``'s value: a version id, else a usage error (2) saying what it takes; a path to a version directory
    (``OUT/versions/v...``, what ``ls`` shows) names the id to give instead."""
    from petal.pipeline.layout import VERSION_RE
    from petal.pipeline.reliability.errors import quote_text

    if value is None or VERSION_RE.match(value):
        return value
    name = os.path.basename(value.rstrip("/"))
    hint = f"; give its id: --version {name}" if VERSION_RE.match(name) else ""
    raise click.BadParameter(f"{quote_text(value, 80)} is not a version id (vNNNNNN-YYYYMMDDTHHMMSSZ, a directory "
                             f"name under OUT/versions){hint}")


def _live(out: OutputDir) -> str | None:
    """The version CURRENT names (``None`` without a readable pointer: --version V is then checked by itself)."""
    from petal.pipeline.reliability.errors import PetalError

    try:
        return out.current_version()
    except PetalError:
        return None
