"""A query model that is not the index's (``petal query --model``, ``petal.open_index(model=...)``) is refused as
such, 78 naming what differs, whatever the model's position limit: one whose limit is below the length the index
was built with was refused with "--max-length 256 exceeds the model's limit", naming a flag the user never gave.
Real MiniLM index, real tiny BERT, real FAISS."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import petal
from petal.cli.main import cli


@pytest.fixture(scope="module")
def minilm_index(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("other-model")
    pq.write_table(pa.table({"id": list(range(4)), "text": [f"document {i} about glaciers" for i in range(4)]}),
                   root / "docs.parquet")
    result = CliRunner().invoke(cli, ["index", str(root / "docs.parquet"), "--out", str(root / "out"), "-q"])
    assert result.exit_code == 0, result.output
    assert petal.open_index(root / "out").manifest.max_length > 160  # above the tiny BERT's positions
    return root / "out"


def test_petal_query_with_a_model_of_fewer_positions_says_it_is_not_the_index_model(minilm_index, tiny_bert_dir):
    result = CliRunner().invoke(cli, ["query", str(minilm_index), "glaciers", "--model", str(tiny_bert_dir)])
    assert result.exit_code == 78, result.output
    assert "--max-length" not in result.stderr, result.stderr
    assert "does not match the index" in result.stderr and "weights_sha256" in result.stderr, result.stderr
    assert "max_length: index 256, model 160" in result.stderr, result.stderr


def test_open_index_with_a_model_of_fewer_positions_raises_config_error(minilm_index, tiny_bert_dir):
    with petal.open_index(minilm_index, model=tiny_bert_dir) as index, \
            pytest.raises(petal.ConfigError, match="does not match the index") as caught:
        index.search("glaciers")
    assert "--max-length" not in str(caught.value)
