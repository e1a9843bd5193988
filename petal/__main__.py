"""``python -m petal``: the ``petal`` command (pyproject's console script ``petal = petal.cli.main:main``), for an
environment whose scripts directory is not on ``PATH`` (``python -m petal index ...``)."""

# NOTE: the top level only under this guard: a `--workers`/`--devices` run's spawned workers import this module again
# (as ``__mp_main__``), and must not run a second CLI
if __name__ == "__main__":
    from petal._startup import quiet_signals

    # NOTE: as petal/__init__.py does for the `petal` script (whose check of argv[0] sees "-m" here): a stop signal
    # while click and the commands load ends the process quietly (128 + its number), never with a traceback
    quiet_signals()

    from petal.cli.main import main

    main()
