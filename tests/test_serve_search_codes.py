"""``/search`` by ``vectors`` on a quantized index: rows are float vectors in the index's space (before
quantization). Its own int8 codes (``petal embed --quantize int8 --calibration OUT``) or sign bits as 0s and 1s were
searched as floats: other hits than ``petal query --vector-file`` gives for the same codes, scores in the hundreds,
no error. Such rows are a 422 that says what to send (and where codes are searched); float rows are served as before.
Real ``petal index``/``petal embed``/``petal serve`` with the packaged model on a few sample texts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_serve import Server, cli_run

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

PETAL = str(Path(sys.executable).parent / "petal")
TEXTS = ["glaciers move downhill under their own weight", "espresso is brewed under pressure",
         "volcanoes erupt molten rock", "rivers carve canyons over millions of years",
         "bread rises as yeast ferments", "cats purr when content"] * 4


@pytest.fixture(scope="module", params=["int8", "binary"])
def served(request, tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp(f"codes-{request.param}")
    (root / "data").mkdir()
    pq.write_table(pa.table({"id": [str(i) for i in range(len(TEXTS))],
                             "text": [f"{t} ({i})" for i, t in enumerate(TEXTS)]}), root / "data" / "s.parquet")
    cli_run("index", root / "data", "--out", root / "out", "-q", "--quantize", request.param)
    server = Server(root / "server.log", root / "out")
    yield request.param, root, server
    server.stop()


def test_codes_sent_as_vectors_are_refused_floats_served(served):
    quantize, root, server = served
    codes_file = root / "codes.npy"
    calibration = ["--calibration", str(root / "out")] if quantize == "int8" else []
    done = subprocess.run([PETAL, "embed", "how do glaciers move", "--query", "--quantize", quantize, *calibration,
                           "--output", str(codes_file)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    codes = np.load(codes_file)
    rows = codes if quantize == "int8" else np.unpackbits(codes, axis=1).astype(np.float32)
    answer = server.client.post("/search", json={"vectors": rows.tolist(), "k": 3})
    assert answer.status_code == 422, answer.text
    message = answer.json()["error"]["message"]
    assert "'vectors' row 0 looks like this" in message and "search_stored" in message, message
    floats = server.client.post("/v1/embeddings", json={"input": "how do glaciers move", "input_type": "query"})
    vector = floats.json()["data"][0]["embedding"]
    by_vector = server.client.post("/search", json={"vectors": [vector], "k": 3})
    by_text = server.client.post("/search", json={"query": "how do glaciers move", "k": 3})
    assert by_vector.status_code == 200 and by_text.status_code == 200, by_vector.text
    assert [h["id"] for h in by_vector.json()["results"][0]["hits"]] == \
        [h["id"] for h in by_text.json()["results"][0]["hits"]]
