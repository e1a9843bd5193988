"""``petal embed``'s JSON lines hold exactly the values of its ``.npy`` and of ``Embedder.encode`` (README: encode
gives "exactly what petal embed writes"): each float32 (float16) value at the shortest text that reads back as the same
value. Before, every value was rounded to 7 decimals: a component 1.3974405e-33 was written 0.0, only 15 of MiniLM's
384 components read back equal, and the signs taken of the rows (binarisation) differed from the .npy's. int8 codes
and packed sign bits are written as they were. ``petal query --json`` scores likewise (they were rounded to 6
decimals: an L2 distance of 1e-7 was 0.0). The real MiniLM."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from petal.cli.main import cli

TEXTS = ["how do glaciers move", "espresso brewing temperature", "the history of the printing press", "x"]
EDGES = [1.3974405e-33, 1e-45, -1e-45, 3.4028235e38, -0.0, 0.0, 0.1, 1.0, -0.07515132, 65504.0, 6e-8, 1e-5]


def lines_of(result) -> list[dict]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_the_line_writer_reads_back_exactly_at_the_shortest_text():
    from petal.cli.embed import _json_line
    from petal.pipeline.jobs.embed import Embedded

    for dtype in (np.float32, np.float16):
        with np.errstate(over="ignore"):
            edges = np.array(EDGES, dtype=dtype)
        edges[~np.isfinite(edges)] = np.finfo(dtype).max  # float16: 3.4e38 overflows
        rows = np.concatenate([edges[None], np.random.default_rng(0).standard_normal((50, len(EDGES)))
                               .astype(dtype) / 20])
        embedded = Embedded(rows, 0, None, False)  # type: ignore[arg-type]
        lines = [_json_line(embedded, i) for i in range(len(rows))]
        back = np.array([json.loads(line)["embedding"] for line in lines]).astype(dtype)
        assert back.tobytes() == rows.tobytes(), dtype  # -0.0 and every bit
        first = json.loads(lines[0])
        assert list(first) == ["index", "embedding"]
        values = lines[0].split('"embedding": [')[1].rstrip("]}").split(", ")
        assert values[6] == "0.1" and values[7] == "1.0"  # shortest, not float64's 0.10000000149011612
        assert all(len(v.lstrip("-").replace(".", "").split("e")[0].lstrip("0")) <= 9 for v in values)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_json_lines_hold_the_npy_and_encode_values(tmp_path: Path, minilm_dir: Path, dtype: str):
    from petal import Embedder

    args = ["embed", "--model", str(minilm_dir), "--device", "cpu", "--output-dtype", dtype]
    npy = tmp_path / "v.npy"
    assert CliRunner().invoke(cli, [*args, *TEXTS, "--output", str(npy)]).exit_code == 0
    lines = lines_of(CliRunner().invoke(cli, [*args, *TEXTS]))
    streamed = lines_of(CliRunner().invoke(cli, [*args, "--stdin"], input="\n".join(TEXTS) + "\n"))
    expected = np.load(npy)
    with Embedder(minilm_dir, device="cpu", output_dtype=dtype) as embedder:
        encoded = embedder.encode(TEXTS)
    assert expected.tobytes() == encoded.tobytes()
    for got in (lines, streamed):
        back = np.array([line["embedding"] for line in got]).astype(dtype)
        assert back.tobytes() == expected.tobytes()
        assert np.array_equal(np.packbits(back >= 0, axis=1), np.packbits(expected >= 0, axis=1))


@pytest.mark.parametrize("quantize", ["int8", "binary"])
def test_codes_and_sign_bits_are_written_as_they_were(tmp_path: Path, minilm_dir: Path, quantize: str):
    args = ["embed", "--model", str(minilm_dir), "--device", "cpu", "--quantize", quantize, *TEXTS]
    npy = tmp_path / "v.npy"
    assert CliRunner().invoke(cli, [*args, "--output", str(npy)]).exit_code == 0
    result = CliRunner().invoke(cli, args)
    expected = np.load(npy)
    assert result.stdout.splitlines() == [json.dumps({"index": i, "embedding": row.tolist()})
                                          for i, row in enumerate(expected)]


@pytest.fixture(scope="module")
def sample_index(tmp_path_factory) -> Path:
    from tests._serve_shared import copy_sample_out

    return copy_sample_out(tmp_path_factory, tmp_path_factory.mktemp("exact-scores") / "out")


def test_query_json_scores_are_faiss_float32_scores(sample_index: Path):
    import petal

    result = CliRunner().invoke(cli, ["query", str(sample_index), "--device", "cpu", "--json", "-k", "5", *TEXTS])
    answers = lines_of(result)
    with petal.open_index(sample_index, device="cpu") as index:
        found = index.search(TEXTS, k=5)
    for answer, hits in zip(answers, found):
        assert [h["id"] for h in answer["hits"]] == [hit.id for hit in hits]
        assert [np.float32(h["score"]) for h in answer["hits"]] == [np.float32(hit.score) for hit in hits]
        assert [h["score"] for h in answer["hits"]] == [float(str(np.float32(hit.score))) for hit in hits]
