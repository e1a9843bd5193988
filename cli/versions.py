"""``petal versions OUT`` and ``petal rollback OUT [VERSION]``: the versions on disk, and making one live."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from petal.cli.common import PATH, json_text, require_stdout, user_errors, write_stdout

if TYPE_CHECKING:
    from petal.pipeline.jobs.versions import VersionEntry


@click.command()
@click.argument("out", metavar="OUT", type=PATH)
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per version, one a line: version, live, created_at, num_vectors, factory, ok "
                   "(and problem when not ok).")
@user_errors(outputs=())
def versions(out: Path, as_json: bool) -> None:
    """List the versions of OUT on disk, newest first: id, created, vectors, index factory, and which one is live
    (CURRENT). A version whose manifest does not read, or records another version id (copied or renamed by
    hand), is marked as no whole version, saying why. Exit 0; 78 when OUT holds no index (missing, no versions/),
    66 when petal may not read it. Any version listed whole can be made live with petal rollback OUT VERSION.
    """
    from petal.pipeline.jobs.versions import list_versions

    require_stdout("petal versions")  # NOTE: stdout closed at start: 74, not a list written nowhere and exit 0
    entries, pointer_problem = list_versions(out)
    if as_json:
        lines = [json_text(entry.as_dict()) for entry in entries]
    else:
        lines = [_line(entry) for entry in entries]
    write_stdout(lines, flush=True)  # NOTE: a full stdout is 74 naming stdout
    if pointer_problem is not None:
        click.echo(f"petal versions: warning: no version is live: {pointer_problem}", err=True)
    elif not entries:
        click.echo(f"petal versions: note: {out} holds no version yet", err=True)


@click.command()
@click.argument("out", metavar="OUT", type=PATH)
@click.argument("version", metavar="[VERSION]", required=False, default=None,
                callback=lambda ctx, param, value: _version_id(value))
@click.option("--wait", is_flag=True, help="If another petal writes to OUT, wait for it instead of exiting 75.")
@user_errors(outputs=())
def rollback(out: Path, version: str | None, wait: bool) -> None:
    """Make VERSION OUT's live version (default: the newest whole version older than the live one).

    Any version on disk may be made live, older or newer than the live one (after a rollback, the newer versions
    stay on disk until a run publishes: rolling forward is petal rollback OUT VNEWER). VERSION must pass the
    checks opening it makes (its manifest reads and records VERSION, its files are there and match their
    records): else exit 78 naming it and the whole versions there. CURRENT is swapped in one rename, under the
    writer lock (75 while a petal index or rebuild runs; --wait queues). VERSION live already: exit 0, nothing
    changed. The next petal index or rebuild starts from the version made live; petal serve follows it.
    """
    from petal.pipeline.api import rollback as make_live
    from petal.pipeline.reliability.errors import quote_path
    from petal.pipeline.reliability.signals import StopSignals

    with StopSignals() as stop:
        done = make_live(out, version, wait=wait, stop=stop)
    if done.changed:
        click.echo(f"petal rollback: {quote_path(done.out)}: live version {done.previous or 'none'} -> {done.version}",
                   err=True)
    else:
        click.echo(f"petal rollback: {quote_path(done.out)}: {done.version} is the live version already; nothing "
                   "changed", err=True)


def _line(entry: VersionEntry) -> str:
    mark = "live" if entry.live else "    "
    if entry.problem is not None:
        return f"{entry.version}  {mark}  NOT WHOLE: {entry.problem}"
    return f"{entry.version}  {mark}  created {entry.created_at}  {entry.num_vectors} vectors  {entry.factory}"


def _version_id(value: str | None) -> str | None:
    """VERSION: a version id, else a usage error (2) saying what it takes (``version_id_problem``)."""
    from petal.pipeline.api import version_id_problem

    problem = None if value is None else version_id_problem(value)
    if problem is not None:
        raise click.BadParameter(problem.replace("--version ", ""))
    return value
