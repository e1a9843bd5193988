"""Peak memory of the index build against ``--index-memory`` (README: "--index-memory is what the index build holds
in RAM"). CPU only, this machine's kind of host:

    python bench/index_memory_probe.py [--rows 100000] [--dim 4096] [--budget 512M] [--workdir /tmp/petal-mem-probe]

Writes ``--rows`` seeded random vectors of ``--dim`` as a Parquet ``--vectors-column`` SOURCE (once, reused), then
runs in fresh processes ``petal index SOURCE --vectors-column emb --index-memory BUDGET`` and ``petal rebuild OUT
--index-memory BUDGET``, sampling each process's anonymous RSS (``/proc/PID/status`` RssAnon) every 10 ms. Prints
per step the peak, the factory built, its training points and recall@10 (the report's), and the wall time.
``PYTHONPATH`` picks the petal measured (a checkout of another commit for a before/after).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MIB = 1 << 20


def write_source(path: Path, rows: int, dim: int) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    writer = None
    for start in range(0, rows, 10_000):
        n = min(10_000, rows - start)
        vectors = rng.standard_normal((n, dim), dtype=np.float32)
        column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), dim)
        table = pa.table({"id": [f"d{i}" for i in range(start, start + n)], "emb": column})
        writer = writer or pq.ParquetWriter(path.with_suffix(".tmp"), table.schema)
        writer.write_table(table)
    assert writer is not None
    writer.close()
    path.with_suffix(".tmp").rename(path)


def anon_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(argv: list[str]) -> tuple[int, float, dict]:
    """``petal ARGV --json`` in a child: (peak anonymous RSS in KiB, seconds, its report)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "petal", *argv, "--json", "-q"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, anon_kib(proc.pid))
        time.sleep(0.01)
    out, err = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"petal {' '.join(argv)}: exit {proc.returncode}\n{err[-2000:]}")
    return peak, time.perf_counter() - start, json.loads(out.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--budget", default="512M")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/petal-mem-probe"))
    args = parser.parse_args()
    source = args.workdir / f"vectors-{args.rows}x{args.dim}.parquet"
    write_source(source, args.rows, args.dim)
    out = args.workdir / "out"
    subprocess.run(["rm", "-rf", str(out)], check=True)
    steps = [("index --vectors-column", ["index", str(source), "--out", str(out), "--vectors-column", "emb",
                                         "--index-memory", args.budget]),
             ("rebuild", ["rebuild", str(out), "--index-memory", args.budget])]
    print(f"{args.rows} x {args.dim} vectors, --index-memory {args.budget}")
    for name, argv in steps:
        peak, seconds, report = run(argv)
        index = report["index"]
        print(f"{name:24s} peak anon {peak / 1024:7.0f} MiB  {index['factory']:16s} "
              f"train {index['device']['train_points']}  recall@10 {index['tuning'].get('recall_at_10')}  "
              f"{seconds:.0f} s")


if __name__ == "__main__":
    main()
