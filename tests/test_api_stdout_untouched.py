"""``petal.index``/``petal.rebuild`` in a caller's process leave its stdout alone: every in-memory index write swapped
fd 1 (process-wide) for a temporary file while FAISS wrote, and the lines the caller's other threads printed
meanwhile came out on stderr (``quiet=True`` or not). Only the on-disk build, whose FAISS calls print, catches fd 1.

A real child process: a thread printing to stdout without pause while the main thread rebuilds a real index (FAISS,
Parquet) twenty times; every line must reach stdout, none stderr."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import sys, threading
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
import petal
root = sys.argv[1]
flat = np.random.default_rng(0).standard_normal((400, 16)).astype(np.float32)
pq.write_table(pa.table({"id": np.arange(400), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), 16)}),
               f"{root}/v.parquet")
petal.index(f"{root}/v.parquet", f"{root}/out", vectors_column="emb", index_factory="Flat", quiet=True)
stop = threading.Event()
printed = 0
def app():
    global printed
    while not stop.is_set():
        print("app-line", flush=True)
        printed += 1
thread = threading.Thread(target=app)
thread.start()
for i in range(20):
    petal.rebuild(f"{root}/out", quiet=True, keep_versions=1, index_factory=["Flat", "IVF2,Flat"][i % 2])
stop.set()
thread.join()
print(f"printed {printed}", flush=True)
"""


def test_a_rebuild_in_process_leaves_other_threads_stdout_alone(tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = int(done.stdout.strip().splitlines()[-1].split()[1])
    assert done.stdout.count("app-line") == printed > 0
    assert "app-line" not in done.stderr, f"{done.stderr.count('app-line')} of {printed} lines went to stderr"
