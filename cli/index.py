"""``petal index SOURCE... --out DIR``: embed Parquet shards and publish a FAISS index."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cli.common import PetalClickError, device_options, eprint, usage
from cli.index_options import index_options


@click.command()
@click.argument("sources", nargs=-1, required=True)
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="Output directory (index + store).")
@click.option("--model", default=None, help="Local model directory (default: the packaged all-MiniLM-L6-v2).")
@click.option("--id-column", default=None, help="Id column [default: id; absent -> '<shard>:<row>'].")
@click.option("--text-column", default="text", show_default=True, help="Text column.")
@device_options
@click.option("--max-length", type=int, default=None, help="Truncate texts to N tokens (default: the model's).")
@click.option("--token-budget", type=int, default=None,
              help="Tokens per engine step (default: 16384 on CUDA, 4096 on the CPU).")
@click.option("--max-seqs", type=int, default=256, show_default=True, help="Sequences per engine step.")
@click.option("--no-cuda-graphs", is_flag=True, help="Run the model eagerly on CUDA.")
@click.option("--index-factory", default="auto", show_default=True,
              help="FAISS index factory string, or auto (Flat when small, IVF above).")
@index_options
@click.option("--full", is_flag=True, help="Rebuild from scratch: re-embed every shard, accept changed settings.")
@click.option("--strict", is_flag=True, help="Any bad row fails the run (exit 65) instead of being skipped.")
@click.option("--json-report", type=click.Path(path_type=Path), default=None, help="Write the run report here.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def index(sources: tuple[str, ...], out: Path, model: str | None, id_column: str | None, text_column: str,
          device: str, dtype: str, attention: str, max_length: int | None, token_budget: int | None, max_seqs: int,
          no_cuda_graphs: bool, index_factory: str, metric: str, index_memory: str, target_recall: float,
          full: bool, strict: bool, json_report: Path | None, quiet: bool) -> None:
    """Embed SOURCE Parquet files, directories or globs and publish a FAISS index in --out.

    Shards already embedded with the same content and settings are reused; a run with nothing
    changed publishes nothing new. The last line on stderr says what happened.
    """
    from pipeline.config import IndexJob, IndexSettings, ReadConfig, parse_size
    from pipeline.errors import PetalError
    from pipeline.report import RunReport

    job = usage(lambda: IndexJob(
        sources=sources, out=out, model=model,
        read=ReadConfig(text_column=text_column, id_column=id_column or "id", id_column_required=id_column is not None),
        index=IndexSettings(factory=index_factory, metric=metric, memory_bytes=parse_size(index_memory),
                            target_recall=target_recall),
        device=device, dtype=dtype, attention=attention, cuda_graphs=not no_cuda_graphs, max_length=max_length,
        token_budget=token_budget, max_seqs=max_seqs, full=full, strict=strict, quiet=quiet, json_report=json_report,
    ))
    report = RunReport(command="index")
    try:
        from pipeline.run import run_index

        try:
            run_index(job, report)
        except ValueError as exc:  # a setting the engine or index cannot take
            if isinstance(exc, PetalError):
                raise
            raise click.UsageError(str(exc)) from exc
    except PetalError as exc:
        report.finish(exc.status, exc.exit_code, str(exc))
        _finish(report, job.json_report)
        raise PetalClickError(str(exc), exc.exit_code) from exc
    except click.UsageError as exc:
        report.finish("failed", 2, str(exc))
        _finish(report, job.json_report)
        raise
    except BaseException as exc:
        report.finish("failed", 1, f"internal error: {exc!r}")
        _finish(report, job.json_report)
        raise
    _finish(report, job.json_report)


def _finish(report: object, json_report: Path | None) -> None:
    if json_report is not None:
        try:
            report.write(json_report)  # type: ignore[attr-defined]
        except OSError as exc:
            eprint(f"petal: warning: cannot write the report to {json_report}: {exc}")
    eprint(report.summary())  # type: ignore[attr-defined]
    sys.stderr.flush()
