"""``petal index SOURCE... --out DIR``: embed Parquet shards and publish a FAISS index."""

from __future__ import annotations

from pathlib import Path

import click

from petal.cli.common import MODEL_DIR, PATH, ReportingCommand, device_flags, hooks, once_option, run_with_report
from petal.cli.index_options import given_index_flags, index_options, kept_default
from petal.cli.options import model_options, output_options
from petal.cli.scale_options import RAY_LOCAL, scale_options


@click.command(cls=ReportingCommand)
@click.argument("sources", nargs=-1, required=True)
# NOTE: --out and --json-report are outputs whose click types check nothing (readable=False): click's own check
# makes an unreadable path a usage error (2); the run judges --out (73) and treats a report it cannot write as a warning
@click.option("--out", "out", required=True, type=PATH,
              help="Output directory (index + store).")
@click.option("--model", type=MODEL_DIR, default=None, metavar="PATH|HF_ID",
              help="Local model directory, or a Hugging Face model id already in the local cache (default: the "
                   "packaged all-MiniLM-L6-v2).")
@click.option("--id-column", default=None,
              help="Id column [default: id; a shard without it gets '<shard>:<row>' ids]. A column named here must be "
                   "in every shard (else exit 65).")
@click.option("--text-column", default="text", show_default=True, help="Text column.")
@click.option("--vectors-column", default=None, metavar="COLUMN",
              help="Index the precomputed embeddings of this column (list<float> or fixed_size_list<float>; "
                   "integer values are read as float32): "
                   "no model is loaded.")
@once_option("--keep-columns", join="name every column in one: --keep-columns A,B", metavar="A,B",
              help="Columns stored with the ids: returned with every hit (petal query, the API) and usable in "
                   "petal query --where. Distinct names, comma-separated; leave the flag out to keep none.")
@device_flags
@click.option("--max-length", type=int, default=None, help="Truncate texts to N tokens (default: the model's).")
@click.option("--token-budget", type=int, default=None,
              help="Tokens per engine step (default: 16384 on CUDA, 4096 on the CPU).")
@click.option("--max-seqs", type=int, default=256, show_default=True, help="Sequences per engine step.")
@click.option("--no-cuda-graphs", is_flag=True, help="Run the model eagerly on CUDA.")
@click.option("--index-factory", default=None, show_default=kept_default("auto"),
              help="FAISS index factory string, or auto (Flat when small, IVF above).")
@index_options
@click.option("--sync", is_flag=True,
              help="The index mirrors exactly the SOURCES: shards not named are removed (default: additive, "
                   "shards not named are kept).")
@click.option("--max-removed", default=None, metavar="N|F",
              help="Fail (exit 65, nothing published) when more documents of the live version would be removed: "
                   "a count or a fraction (0.1, 10%) [default: 0; 10% with --sync].")
@once_option("--delete", "delete", type=PATH, join="put every id to remove in one file", metavar="IDS.parquet",
              help="Remove these ids (the id column, or the file's only column) in the version this run publishes; "
                   "read as the index's ids: integer ids by value (007 is 7; 7.0 is exit 65), string ids by exact "
                   "text.")
@click.option("--full", is_flag=True, help="Rebuild from scratch: re-embed every shard, accept changed settings.")
@click.option("--strict", is_flag=True, help="Any bad row fails the run (exit 65) instead of being skipped.")
@click.option("--max-bad-rows", default=None, metavar="N|F",
              help="Fail (exit 65) when more rows than this are skipped: a count (100) or a fraction (0.01, 1%).")
@click.option("--keep-versions", type=int, default=2, show_default=True,
              help="Versions kept after a publish: the live one and N-1 before it (rollback).")
@click.option("--keep-unused", default="7d", show_default=True, metavar="DURATION",
              help="Keep store entries no version uses (an interrupted or refused run's work, which its rerun "
                   "reuses) this long after their commit: seconds, or 30m, 12h, 7d; 0 deletes them at once.")
@click.option("--wait", is_flag=True, help="If another petal writes to --out, wait for it instead of exiting 75.")
@click.option("--json-report", type=PATH, default=None,
              help="Write the run report here (every run not killed by SIGKILL writes one; - is stdout).")
@click.option("--json", "as_json", is_flag=True, help="Print the run report (JSON) on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@model_options
@output_options
@scale_options
def index(sources: tuple[str, ...], out: Path, model: str | None, id_column: str | None, text_column: str,
          vectors_column: str | None, keep_columns: str | None,
          device: str, dtype: str, attention: str, max_length: int | None, token_budget: int | None, max_seqs: int,
          no_cuda_graphs: bool, index_factory: str | None, metric: str | None, index_memory: str | None,
          target_recall: float | None,
          sync: bool, max_removed: str | None, delete: Path | None, full: bool, strict: bool,
          max_bad_rows: str | None, keep_versions: int, keep_unused: str, wait: bool,
          json_report: Path | None, as_json: bool, quiet: bool, pooling: str | None, attention_mask: str | None,
          query_prompt: str | None, allow_pickle_weights: bool, dim: int | None, quantize: str,
          output_dtype: str, devices: str | None, workers: int | None, ray: str | None,
          range_rows: int | None) -> None:
    """Embed SOURCE Parquet files, directories or globs and publish a FAISS index in --out.

    Shards already embedded with the same content and settings are reused; a run with nothing
    changed publishes nothing new. An index flag not given keeps the live version's setting (the factory it
    asked for, its metric, memory budget and target recall; `--full` too), as `petal rebuild` does. The last
    line on stderr says what happened; the exit code is
    the contract of the README (0 ok, 2 usage, 65 bad input, 66 no input, 73 cannot create output,
    74 I/O error, 75 retry, 78 configuration, 129/130/143 interrupted).
    """
    from petal.pipeline.jobs.report import RunReport
    from petal.pipeline.reliability.notes import notes_on_stderr
    from petal.pipeline.reliability.signals import StopSignals

    report = RunReport(command="index")
    flags = given_index_flags(index_factory, metric, index_memory, target_recall)  # the others: the live version's
    # NOTE: signals are caught from here on (before the heavy imports), so a SIGTERM at any moment
    # ends in a clean stop with a report; the run checks the flag at every batch boundary.
    with StopSignals() as stop, notes_on_stderr():  # NOTE: -q hides the progress bar only (the API's quiet: notes too)
        from petal.pipeline.api import index as run_index

        run_with_report(report, lambda: run_index(
            sources, out, engine_factory=hooks().engine_factory, report=report, stop=stop,
            model=model, text_column=text_column, id_column=id_column, vectors_column=vectors_column,
            keep_columns=keep_columns, sync=sync, max_removed=max_removed, delete=delete, **flags,
            device=device, dtype=dtype, attention=attention, cuda_graphs=not no_cuda_graphs, max_length=max_length,
            token_budget=token_budget,
            max_seqs=max_seqs, full=full, strict=strict, quiet=quiet, json_report=json_report,
            keep_versions=keep_versions, keep_unused=keep_unused, wait=wait, max_bad_rows=max_bad_rows, pooling=pooling,
            attention_mask=attention_mask, query_prompt=query_prompt,
            allow_pickle_weights=allow_pickle_weights, dim=dim, quantize=quantize, output_dtype=output_dtype,
            devices=devices, workers=workers, ray=ray is not None,
            ray_address=None if ray in (None, RAY_LOCAL) else ray, range_rows=range_rows,
        ), as_json=as_json, json_report=json_report)
