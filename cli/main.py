"""``petal``: Parquet shards -> a searchable FAISS index, and queries against it."""

from __future__ import annotations

import gc

import click

from petal import __version__
from petal.cli.bench import bench
from petal.cli.common import PetalGroup, defer_gc_for_startup, offline
from petal.cli.embed import embed
from petal.cli.index import index
from petal.cli.info import info
from petal.cli.query import query
from petal.cli.rebuild import rebuild
from petal.cli.serve import serve
from petal.cli.verify import verify


class Petal(PetalGroup):
    one_shot = frozenset({"embed", "query"})  # they end startup (startup_done) once model and index are loaded


@click.group(cls=Petal, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="petal")
def cli() -> None:
    """petal: turn Parquet shards of text into a searchable FAISS index, fast.

    \b
    petal index sample_data --out /tmp/idx
    petal query /tmp/idx "how do glaciers move" -k 5
    petal embed "a one-shot query" > vec.jsonl
    petal serve /tmp/idx --port 8080

    Exit codes: 0 ok, 1 bug, 2 usage, 65 bad input, 66 no input, 73 cannot create output,
    74 I/O error, 75 temporary (retry), 78 configuration, 129/130/143 interrupted by SIGHUP/SIGINT/SIGTERM,
    141 stdout closed by its reader.
    """
    offline()


cli.add_command(index)
cli.add_command(query)
cli.add_command(embed)
cli.add_command(info)
cli.add_command(rebuild)
cli.add_command(serve)
cli.add_command(verify)
cli.add_command(bench)


def main() -> None:
    """The ``petal`` script: one command, then the process ends."""
    defer_gc_for_startup()
    try:
        cli()
    finally:
        # NOTE: the process ends here: the interpreter's last collections would walk every object torch and the
        # model made (0.1-0.5 s on the 2-core machine) to free memory the OS takes back anyway. Frozen, they are
        # skipped; atexit handlers still run, stdout and stderr are still flushed, files were closed by their
        # ``with`` blocks.
        gc.freeze()


if __name__ == "__main__":
    main()
