"""``petal bench``: the benchmark protocol of PERFORMANCE.md (ratios measured in one run)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from cli.common import user_errors


@click.group()
def bench() -> None:
    """Benchmarks: petal against named baselines, measured in the same process."""


@bench.command("cpu")
@click.option("--corpus", type=click.Path(path_type=Path), default=Path("sample_data"), show_default=True,
              help="Parquet files whose sentences build the benchmark texts.")
@click.option("--texts", "num_texts", type=click.IntRange(min=16), default=2000, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--token-budget", type=click.IntRange(min=256), default=4096, show_default=True)
@click.option("--model", default=None, help="Model directory (default: the packaged all-MiniLM-L6-v2).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@user_errors
def bench_cpu(corpus: Path, num_texts: int, rounds: int, token_budget: int, model: str | None, as_json: bool) -> None:
    """MiniLM on the CPU: petal (fp32, and bf16 GEMMs) vs sentence-transformers encode()."""
    from pipeline.benchmarks.cpu import format_cpu_table, run_cpu_bench

    result = run_cpu_bench(corpus, num_texts=num_texts, rounds=rounds, token_budget=token_budget, model=model)
    click.echo(json.dumps(result) if as_json else format_cpu_table(result))
