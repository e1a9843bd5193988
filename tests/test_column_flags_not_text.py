"""A column-name flag of ``petal index`` holding a command-line byte that is not UTF-8 (read by surrogateescape, a
lone surrogate; the API's keyword likewise): no Parquet column has that name, and Arrow cannot encode it. It ended in
a raw UnicodeEncodeError traceback (exit 1) where the schema was searched; now a usage error naming the flag and the
character (exit 2; ``UsageError`` from ``petal.index``), before any shard is read. Real Parquet (sample_data)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import petal
from petal.cli.main import cli
from tests.conftest import SAMPLE_DATA

NAME = "to\udcffpic"  # what Python makes of argv's b"to\xffpic"


@pytest.mark.parametrize("flag", ["--id-column", "--text-column", "--vectors-column", "--keep-columns"])
def test_a_column_flag_that_is_not_text_is_a_usage_error(tmp_path, flag):
    result = CliRunner().invoke(cli, ["index", str(SAMPLE_DATA), "--out", str(tmp_path / "out"), "-q", flag, NAME])
    assert result.exit_code == 2, result.output
    assert f"{flag} {NAME!r}: character 3 is not text" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "out" / "CURRENT").exists()


@pytest.mark.parametrize("keyword,value", [("id_column", NAME), ("text_column", NAME), ("vectors_column", NAME),
                                           ("keep_columns", ["topic", NAME])])
def test_the_api_refuses_the_same_names(tmp_path, keyword, value):
    with pytest.raises(petal.UsageError, match="character 3 is not text"):
        petal.index(str(SAMPLE_DATA), str(tmp_path / "out"), quiet=True, **{keyword: value})
