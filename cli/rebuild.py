"""``petal rebuild OUT``: rebuild the live index from the embedding store with other settings."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from petal.cli.common import PATH, ReportingCommand, run_with_report
from petal.cli.index_options import given_index_flags, index_options


@click.command(cls=ReportingCommand)
# NOTE: OUT and --json-report check nothing at parsing (readable=False): click's own check makes an unreadable path a
# usage error (2); the run judges OUT (73) and treats a report it cannot write as a warning
@click.argument("out", type=PATH)
@click.option("--index-factory", default=None, show_default="the live version's",
              help="FAISS index factory string, or auto (Flat when small, IVF above).")
@functools.partial(index_options, first_run=False)
# NOTE: below 1 is refused by the run, worded as petal index words it (click's IntRange said "not in the range x>=1")
@click.option("--keep-versions", type=int, default=2, show_default=True,
              help="Versions kept after the publish: the live one and N-1 before it (rollback), as petal index's.")
@click.option("--wait", is_flag=True, help="If another petal writes to OUT, wait for it instead of exiting 75.")
@click.option("--json-report", type=PATH, default=None,
              help="Write the run report here (every run not killed by SIGKILL writes one; - is stdout).")
@click.option("--json", "as_json", is_flag=True, help="Print the run report (JSON) on stdout.")
# NOTE: petal index takes -q, and a script that passes it to both got 'No such option'; a rebuild shows no progress
# bar, so it changes nothing (notes and warnings stay on stderr, as petal index -q's)
@click.option("-q", "--quiet", is_flag=True, help="No progress bar (as petal index; a rebuild shows none).")
def rebuild(out: Path, index_factory: str | None, metric: str | None, index_memory: str | None,
            target_recall: float | None, keep_versions: int, wait: bool, json_report: Path | None,
            as_json: bool, quiet: bool) -> None:
    """Build a new version of OUT's index from its stored embeddings: no model, no re-embedding.

    The shards, ids and vectors are those of the live version; only the index settings given change (one not
    given keeps the live version's: the factory it asked for, its metric, memory budget and target recall).
    A later `petal index` run keeps them too. Exit codes and signals are
    those of `petal index` (75 locked, 74 disk full with nothing left behind, 130/143/129 on
    SIGINT/SIGTERM/SIGHUP).
    """
    from petal.pipeline.api import rebuild as run_rebuild
    from petal.pipeline.jobs.report import RunReport
    from petal.pipeline.reliability.signals import StopSignals

    flags = given_index_flags(index_factory, metric, index_memory, target_recall)  # the others: the live version's
    report = RunReport(command="rebuild")
    with StopSignals() as stop:
        run_with_report(report, lambda: run_rebuild(out, json_report=json_report, report=report, wait=wait, stop=stop,
                                                    keep_versions=keep_versions, **flags), as_json=as_json,
                        json_report=json_report)
