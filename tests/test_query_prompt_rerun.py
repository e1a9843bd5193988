"""``petal index --query-prompt`` over shards that did not change: the prompt is recorded for queries only (no
stored vector depends on it), so the run publishes a version that records it, embedding nothing again. It was
"nothing-to-do ... no shard or setting changed" at exit 0, the flag dropped (a running ``petal serve`` never saw the
change); the same flag with a changed shard was recorded. Real Parquet and FAISS, the fake engine."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.fake_cli import invoke as fake_invoke
from tests.fake_engine import embedded_ids, make_fake_model_dir


def recorded_prompt(out: Path) -> str:
    version = (out / "CURRENT").read_text().strip()
    return json.loads((out / "versions" / version / "manifest.json").read_text())["model"]["prompts"]["query"]


def test_a_query_prompt_change_alone_publishes_a_version_recording_it(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": [1, 2, 3], "text": ["glaciers move", "zebra stripes", "river deltas"]}),
                   data / "a.parquet")
    model = make_fake_model_dir(tmp_path / "model")
    out, log, report = tmp_path / "out", tmp_path / "fake.jsonl", tmp_path / "report.json"

    def index(*flags: str) -> dict:
        log.unlink(missing_ok=True)
        result = fake_invoke(["index", str(data), "--out", str(out), "--model", str(model), "-q",
                              "--json-report", str(report), *flags], env={"PETAL_TEST_FAKE_ENGINE": str(log)})
        assert result.exit_code == 0, result.output
        return json.loads(report.read_text())

    assert index()["status"] == "success" and recorded_prompt(out) == ""
    first = (out / "CURRENT").read_text()
    changed = index("--query-prompt", "query: ")
    assert changed["status"] == "success", changed
    assert recorded_prompt(out) == "query: " and (out / "CURRENT").read_text() != first
    assert embedded_ids(log) == []  # the stored vectors are reused
    assert index("--query-prompt", "query: ")["status"] == "nothing-to-do"
    assert recorded_prompt(out) == "query: "
    assert index()["status"] == "success" and recorded_prompt(out) == ""  # each run's flags say the version's prompt
    assert embedded_ids(log) == []
