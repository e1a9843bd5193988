"""``petal embed --id-column ""`` (or ``--text-column ""``) names no column: a usage error (2) naming the flag, before
the model loads, as ``petal index`` refuses either. Before: the reader took ``""`` as no id column (``if id_column``)
while the command waited for ids (``is not None``): a .parquet or .jsonl ``--input`` was an IndexError traceback
(exit 1) once the model had loaded, with ``--quantize int8`` (the whole file read) exit 0 and no ids written, silently;
``--text-column ""`` was 65 'no column ''' naming the file. The packaged model, real Parquet, the CLI."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import petal
from petal.cli.main import cli
from petal.pipeline.ingest.texts import read_texts, text_file_batches

TEXTS = ["glaciers move slowly", "rivers carve valleys", "wind shapes dunes"]


@pytest.fixture
def inputs(tmp_path):
    parquet = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": TEXTS, "id": [1, 2, 3]}), parquet)
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(f'{{"text": "{t}", "id": {i}}}\n' for i, t in enumerate(TEXTS, 1)))
    return {"parquet": parquet, "jsonl": jsonl}


@pytest.mark.parametrize("flag", ["--id-column", "--text-column"])
@pytest.mark.parametrize("quantize", ["none", "int8"])
@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_an_empty_column_flag_is_a_usage_error(inputs, tmp_path, minilm_dir, suffix, quantize, flag):
    out = tmp_path / "out.jsonl"
    for output in ([], ["--output", str(out)]):
        result = CliRunner().invoke(cli, ["embed", "--input", str(inputs[suffix]), flag, "", "--quantize", quantize,
                                          *output])
        assert result.exit_code == 2, result.output
        assert f"{flag} must not be empty" in result.stderr and "Traceback" not in result.output, result.output
        assert result.stdout == "" and not out.exists()


@pytest.mark.parametrize(("flag", "other"), [("--id-column", "--text-column"), ("--text-column", "--id-column")])
def test_petal_index_refuses_them_too(inputs, tmp_path, flag, other):
    """The rule ``petal embed`` now shares: ``petal index --id-column ""`` and the API's ``id_column=""``, naming the
    one that is empty (both were "--text-column and --id-column must not be empty")."""
    result = CliRunner().invoke(cli, ["index", str(inputs["parquet"]), "--out", str(tmp_path / "o"), "-q",
                                      flag, ""])
    assert result.exit_code == 2 and f"{flag} must not be empty" in result.output, result.output
    assert other not in result.output, result.output
    keyword = flag[2:].replace("-", "_")
    with pytest.raises(petal.UsageError, match=f"^{keyword} must not be empty"):
        petal.index([str(inputs["parquet"])], tmp_path / "o", quiet=True, **{keyword: ""})
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_the_readers_refuse_an_empty_column_rather_than_drop_the_ids(inputs, suffix):
    """``read_texts`` returned ``None`` ids for ``id_column=""`` and ``text_file_batches`` ``[]`` ids a window."""
    for kwargs, flag in (({"id_column": ""}, "--id-column"), ({"text_column": ""}, "--text-column")):
        with pytest.raises(petal.UsageError, match=f"^{flag} must not be empty"):
            read_texts(inputs[suffix], **kwargs)
        with pytest.raises(petal.UsageError, match=f"^{flag} must not be empty"):
            next(text_file_batches(inputs[suffix], **kwargs))
    texts, ids = read_texts(inputs[suffix], id_column="id")
    assert texts == TEXTS and ids == [1, 2, 3]
