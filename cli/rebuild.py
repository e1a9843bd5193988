"""``petal rebuild OUT``: rebuild the live index from the embedding store with other settings."""

from __future__ import annotations

from pathlib import Path

import click

from petal.cli.common import PetalClickError, eprint, usage
from petal.cli.index_options import index_options


@click.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--index-factory", default="auto", show_default=True,
              help="FAISS index factory string, or auto (Flat when small, IVF above).")
@index_options
@click.option("--json-report", type=click.Path(path_type=Path), default=None,
              help="Write the run report here (- is stdout).")
@click.option("--json", "as_json", is_flag=True, help="Print the run report (JSON) on stdout.")
def rebuild(out: Path, index_factory: str, metric: str, index_memory: str, target_recall: float,
            json_report: Path | None, as_json: bool) -> None:
    """Build a new version of OUT's index from its stored embeddings: no model, no re-embedding.

    The shards, ids and vectors are those of the live version; only the index settings change.
    A later `petal index` run builds with its own index flags again.
    """
    from petal.pipeline.config import IndexSettings, parse_size
    from petal.pipeline.jobs.rebuild import run_rebuild
    from petal.pipeline.jobs.report import RunReport
    from petal.pipeline.reliability.errors import PetalError

    settings = usage(lambda: IndexSettings(factory=index_factory, metric=metric,
                                           memory_bytes=parse_size(index_memory), target_recall=target_recall))
    report = RunReport(command="rebuild")
    try:
        try:
            run_rebuild(out, settings, report)
        except ValueError as exc:  # a factory string FAISS rejects, too few vectors to train it
            if isinstance(exc, PetalError):
                raise
            raise click.UsageError(str(exc)) from exc
    except PetalError as exc:
        report.finish(exc.status, exc.exit_code, str(exc))
        _finish(report, json_report, as_json)
        raise PetalClickError(str(exc), exc.exit_code) from exc
    except click.UsageError as exc:
        report.finish("failed", 2, str(exc))
        _finish(report, json_report, as_json)
        raise
    _finish(report, json_report, as_json)


def _finish(report: object, json_report: Path | None, as_json: bool = False) -> None:
    if as_json:
        report.write(Path("-"))  # type: ignore[attr-defined]
    if json_report is not None:
        try:
            report.write(json_report)  # type: ignore[attr-defined]
        except OSError as exc:
            eprint(f"petal: warning: cannot write the report to {json_report}: {exc}")
    eprint(report.summary())  # type: ignore[attr-defined]
