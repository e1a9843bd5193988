"""``petal index SOURCE... --out DIR``: embed Parquet shards and publish a FAISS index."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from petal.cli.common import PetalClickError, device_options, eprint, usage
from petal.cli.index_options import index_options
from petal.cli.options import model_options, output_options
from petal.cli.scale_options import scale_config, scale_options

# NOTE: test-only seam. Set to a log file, it swaps the model for tests/fake_engine.py (a deterministic
# hash -> vector embedder that logs every row it embeds), so crash and signal tests run in subprocesses
# without loading weights. Tests are not shipped: in an installed petal it fails with exit 78.
FAKE_ENGINE_ENV = "PETAL_TEST_FAKE_ENGINE"


class ReportingCommand(click.Command):
    """A command whose flag-parsing errors still write the ``--json-report`` (status failed, exit 2)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # NOTE: click's parser consumes ``args`` in place
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            path = _flag_value(given, "--json-report")
            if path is not None:
                from petal.pipeline.jobs.report import RunReport

                report = RunReport(command="index")
                report.finish("failed", 2, f"usage error: {exc.format_message()}")
                _finish(report, Path(path), quiet=True)
            raise


def _flag_value(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def engine_factory() -> Callable[..., Any] | None:
    """The engine factory to use: ``None`` (the real engine) unless the test-only seam is set."""
    log = os.environ.get(FAKE_ENGINE_ENV)
    if not log:
        return None
    from petal.pipeline.reliability.errors import EXIT_CONFIG

    try:
        from tests.fake_engine import fake_engine_factory
    except ImportError as exc:
        raise PetalClickError(f"{FAKE_ENGINE_ENV} is set, but petal's test helpers are not importable; it is "
                              "for petal's own tests only: unset it", EXIT_CONFIG) from exc
    return fake_engine_factory(Path(log))


@click.command(cls=ReportingCommand)
@click.argument("sources", nargs=-1, required=True)
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="Output directory (index + store).")
@click.option("--model", default=None, help="Local model directory (default: the packaged all-MiniLM-L6-v2).")
@click.option("--id-column", default=None, help="Id column [default: id; absent -> '<shard>:<row>'].")
@click.option("--text-column", default="text", show_default=True, help="Text column.")
@click.option("--vectors-column", default=None, metavar="COLUMN",
              help="Index the precomputed embeddings of this column (list<float> or fixed_size_list<float>): "
                   "no model is loaded.")
@click.option("--keep-columns", default=None, metavar="A,B",
              help="Columns stored with the ids: returned with every hit (petal query, the API) and usable in "
                   "petal query --where.")
@device_options
@click.option("--max-length", type=int, default=None, help="Truncate texts to N tokens (default: the model's).")
@click.option("--token-budget", type=int, default=None,
              help="Tokens per engine step (default: 16384 on CUDA, 4096 on the CPU).")
@click.option("--max-seqs", type=int, default=256, show_default=True, help="Sequences per engine step.")
@click.option("--no-cuda-graphs", is_flag=True, help="Run the model eagerly on CUDA.")
@click.option("--index-factory", default="auto", show_default=True,
              help="FAISS index factory string, or auto (Flat when small, IVF above).")
@index_options
@click.option("--sync", is_flag=True,
              help="The index mirrors exactly the SOURCES: shards not named are removed (default: additive, "
                   "shards not named are kept).")
@click.option("--max-removed", default=None, metavar="N|F",
              help="Fail (exit 65, nothing published) when more documents of the live version would be removed: "
                   "a count or a fraction (0.1, 10%) [default: 0; 10% with --sync].")
@click.option("--delete", "delete", type=click.Path(path_type=Path), default=None, metavar="IDS.parquet",
              help="Remove these ids (the id column, or the file's only column) in the version this run publishes.")
@click.option("--full", is_flag=True, help="Rebuild from scratch: re-embed every shard, accept changed settings.")
@click.option("--strict", is_flag=True, help="Any bad row fails the run (exit 65) instead of being skipped.")
@click.option("--max-bad-rows", default=None, metavar="N|F",
              help="Fail (exit 65) when more rows than this are skipped: a count (100) or a fraction (0.01, 1%).")
@click.option("--keep-versions", type=int, default=2, show_default=True,
              help="Versions kept after a publish: the live one and N-1 before it (rollback).")
@click.option("--wait", is_flag=True, help="If another petal writes to --out, wait for it instead of exiting 75.")
@click.option("--json-report", type=click.Path(path_type=Path), default=None,
              help="Write the run report here (every run not killed by SIGKILL writes one; - is stdout).")
@click.option("--json", "as_json", is_flag=True, help="Print the run report (JSON) on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@model_options
@output_options
@scale_options
def index(sources: tuple[str, ...], out: Path, model: str | None, id_column: str | None, text_column: str,
          vectors_column: str | None, keep_columns: str | None,
          device: str, dtype: str, attention: str, max_length: int | None, token_budget: int | None, max_seqs: int,
          no_cuda_graphs: bool, index_factory: str, metric: str, index_memory: str, target_recall: float,
          sync: bool, max_removed: str | None, delete: Path | None, full: bool, strict: bool,
          max_bad_rows: str | None, keep_versions: int, wait: bool,
          json_report: Path | None, as_json: bool, quiet: bool, pooling: str | None, attention_mask: str | None,
          query_prompt: str | None, allow_pickle_weights: bool, dim: int | None, quantize: str,
          output_dtype: str, devices: str | None, workers: int | None, ray: str | None) -> None:
    """Embed SOURCE Parquet files, directories or globs and publish a FAISS index in --out.

    Shards already embedded with the same content and settings are reused; a run with nothing
    changed publishes nothing new. The last line on stderr says what happened; the exit code is
    the contract of the README (0 ok, 65 bad input, 66 no input, 73/74 output, 75 retry,
    78 configuration, 130/143 interrupted).
    """
    from petal.engine.config import ModelOptions
    from petal.pipeline.config import BadRowBudget, IndexJob, IndexSettings, ReadConfig, parse_size
    from petal.pipeline.index.plan import check_index_factory, index_kind
    from petal.pipeline.jobs.removals import RemovalLimit
    from petal.pipeline.jobs.report import RunReport
    from petal.pipeline.reliability.errors import PetalError
    from petal.pipeline.store.columns import parse_keep_columns
    from petal.pipeline.store.outputs import OutputConfig

    report = RunReport(command="index")
    try:
        job = usage(lambda: IndexJob(
            sources=sources, out=out, model=model,
            read=ReadConfig(text_column=text_column, id_column=id_column or "id",
                            id_column_required=id_column is not None),
            index=IndexSettings(factory=index_factory, metric=metric, memory_bytes=parse_size(index_memory),
                                target_recall=target_recall),
            device=device, dtype=dtype, attention=attention, cuda_graphs=not no_cuda_graphs, max_length=max_length,
            token_budget=token_budget, max_seqs=max_seqs, full=full, strict=strict, quiet=quiet,
            json_report=json_report, keep_versions=keep_versions, wait=wait,
            max_bad_rows=BadRowBudget.parse(max_bad_rows) if max_bad_rows is not None else None,
            sync=sync, max_removed=RemovalLimit.parse(max_removed) if max_removed is not None else None,
            delete=delete, keep_columns=parse_keep_columns(keep_columns),
            model_options=ModelOptions(pooling=pooling, attention_mask=attention_mask,  # type: ignore[arg-type]
                                       query_prompt=query_prompt, allow_pickle_weights=allow_pickle_weights),
            output=OutputConfig(dim=dim, quantize=quantize, output_dtype=output_dtype),
            scale=scale_config(devices, workers, ray),
        ))
        usage(lambda: check_index_factory(job.index, index_kind(job.output.quantize, job.output.output_dtype)))
        if vectors_column is not None:
            usage(lambda: check_vectors_flags(model, dim, quantize, output_dtype))
    except click.UsageError as exc:
        report.finish("failed", 2, str(exc))
        _finish(report, json_report, as_json=as_json)
        raise
    from petal.pipeline.reliability.signals import StopSignals

    # NOTE: signals are caught from here on (before the heavy imports), so a SIGTERM at any moment
    # ends in a clean stop with a report; the run checks the flag at every batch boundary.
    with StopSignals() as stop:
        try:
            from petal.pipeline.jobs.index_run import run_index

            factory = engine_factory()
            try:
                if vectors_column is not None:
                    from petal.pipeline.jobs.vector_run import run_vector_index

                    run_vector_index(job, vectors_column, report, stop=stop)
                elif factory is None:
                    run_index(job, report, stop=stop)
                else:
                    run_index(job, report, factory, stop=stop)
            except ValueError as exc:  # a setting the engine or index cannot take
                if isinstance(exc, PetalError):
                    raise
                raise click.UsageError(str(exc)) from exc
        except PetalError as exc:
            report.finish(exc.status, exc.exit_code, str(exc))
            _finish(report, job.json_report, as_json=as_json)
            raise PetalClickError(str(exc), exc.exit_code) from exc
        except PetalClickError as exc:
            report.finish("failed", exc.exit_code, exc.format_message())
            _finish(report, job.json_report, as_json=as_json)
            raise
        except click.UsageError as exc:
            report.finish("failed", 2, str(exc))
            _finish(report, job.json_report, as_json=as_json)
            raise
        except BaseException as exc:
            report.finish("failed", 1, f"internal error: {exc!r}")
            _finish(report, job.json_report, as_json=as_json)
            raise
        _finish(report, job.json_report, as_json=as_json)


def _finish(report: Any, json_report: Path | None, quiet: bool = False, as_json: bool = False) -> None:
    if as_json:
        from petal.pipeline.jobs.report_file import STDOUT

        report.write(STDOUT)
    if json_report is not None:
        try:
            report.write(json_report)
        except OSError as exc:
            eprint(f"petal: warning: cannot write the report to {json_report}: {exc}")
    if not quiet:
        eprint(report.summary())
    sys.stderr.flush()


def check_vectors_flags(model: str | None, dim: int | None, quantize: str, output_dtype: str) -> None:
    """``--vectors-column`` indexes the vectors as they are: model and output flags do not apply."""
    given = [flag for flag, on in (("--model", model is not None), ("--dim", dim is not None),
                                   ("--quantize", quantize != "none"), ("--output-dtype", output_dtype != "float32"))
             if on]
    if given:
        raise ValueError(f"--vectors-column indexes precomputed vectors as they are; {', '.join(given)} do not apply")
