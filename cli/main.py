"""``petal``: Parquet shards -> a searchable FAISS index, and queries against it."""

from __future__ import annotations

import click

from cli.bench import bench
from cli.common import offline
from cli.embed import embed
from cli.index import index
from cli.info import info
from cli.query import query
from cli.rebuild import rebuild
from pipeline import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="petal")
def cli() -> None:
    """petal: turn Parquet shards of text into a searchable FAISS index, fast.

    \b
    petal index sample_data --out /tmp/idx
    petal query /tmp/idx "how do glaciers move" -k 5
    petal embed "a one-shot query" > vec.jsonl

    Exit codes: 0 ok, 1 bug, 2 usage, 65 bad input, 66 no input, 73 cannot create output,
    74 I/O error, 75 temporary (retry), 78 configuration, 130/143 interrupted.
    """
    offline()


cli.add_command(index)
cli.add_command(query)
cli.add_command(embed)
cli.add_command(info)
cli.add_command(rebuild)
cli.add_command(bench)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
