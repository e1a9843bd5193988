"""What a newcomer following the README sees, through the real CLI (subprocess, packaged MiniLM)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def _petal(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_index_progress_bar_reports_the_tokens_of_the_last_batches(tmp_path: Path) -> None:
    """The progress bar's tok/s counted only batches finished while chunks were still being read, and was not
    updated after the final flush and drain: a small run (one packed batch) ended on "0 tok/s", a larger one
    on a stale rate well below the report's."""
    shard = tmp_path / "s.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"],
                             "text": ["how glaciers move", "volcanoes erupt when magma rises",
                                      "tea is brewed from leaves"]}), shard)
    done = _petal("index", str(shard), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    bars = [part for part in re.split(r"[\r\n]", done.stderr) if part.startswith("embedding:")]
    assert bars, done.stderr
    rate = re.search(r"([\d,]+) tok/s", bars[-1])
    assert rate is not None, bars[-1]
    assert int(rate.group(1).replace(",", "")) > 0, bars[-1]


def test_help_says_what_show_text_model_and_output_do() -> None:
    """--help described older behaviour: --show-text 'read back from its shard' (the text is stored with the
    index), --model 'Local model directory' (a cached Hugging Face id works too, as the README's PATH|HF_ID says)
    and embed --output 'FILE.npy (float32 rows)' (float16, int8 codes and sign bits are written as asked)."""
    query = _petal("query", "--help", timeout=60)
    assert query.returncode == 0, query.stderr
    assert "stored with the index" in " ".join(query.stdout.split()), query.stdout
    for command in ("index", "embed"):
        done = _petal(command, "--help", timeout=60)
        assert done.returncode == 0, done.stderr
        assert "--model PATH|HF_ID" in done.stdout and "Hugging Face" in done.stdout, done.stdout
    embed = " ".join(_petal("embed", "--help", timeout=60).stdout.split())
    assert "float32 rows" not in embed and "int8" in embed.split("--output PATH", 1)[1].split("--max-length")[0], embed


def test_an_index_memory_that_is_no_size_names_the_flag(tmp_path: Path) -> None:
    """`--index-memory 12Q` was exit 2 with "size '12Q' is not a number ..." naming no flag (petal index, petal
    rebuild and petal bench index alike); a user's mistake names the flag it came from."""
    for args in (["index", str(tmp_path / "src"), "--out", str(tmp_path / "out")], ["rebuild", str(tmp_path / "out")],
                 ["bench", "index", "--workdir", str(tmp_path / "bench")]):
        done = _petal(*args, "--index-memory", "12Q", timeout=60)
        assert done.returncode == 2, done.stderr
        assert "--index-memory" in done.stderr and "'12Q'" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
