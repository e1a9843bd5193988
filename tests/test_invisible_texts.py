"""A text of only invisible characters (Unicode's Default_Ignorable_Code_Point: the soft hyphen, variation
selectors, tag characters, Hangul fillers, ... beside the zero-width and bidi marks) has nothing visible: it is
skipped and counted (``empty_text``) by ``petal index``, ``petal embed`` and ``petal query`` alike. Before, only
whitespace, C0/C1 controls, U+200B-U+200F, U+2028-U+202F, U+2060-U+206F and U+FEFF counted as invisible: a row of
soft hyphens was embedded, MiniLM's tokenizer gave it no token but [CLS] [SEP], and every such row got that one
vector, which outranked the real documents for a query ("anything": 0.369 against 0.267)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.ingest.text_rule import skip_reason
from tests.invariants import live

# Default_Ignorable_Code_Point (Unicode 15.1 DerivedCoreProperties.txt), every range
DEFAULT_IGNORABLE = [(0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
                     (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
                     (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
                     (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF)]
INVISIBLE = [chr(c) for low, high in DEFAULT_IGNORABLE for c in range(low, high + 1)]


def test_every_default_ignorable_character_is_nothing_visible():
    missed = [f"U+{ord(c):04X}" for c in INVISIBLE if skip_reason(c * 3) != "empty_text"]
    assert not missed
    assert skip_reason(" \u00ad\ufe0f\U000e0041\u3164\n") == "empty_text"
    kept = [f"U+{ord(c):04X}" for c in INVISIBLE if skip_reason(f"a{c}b") is not None]
    assert not kept  # beside a visible character it is text, embedded as given
    assert skip_reason("\u2800") is None and skip_reason("\U0001f9ca") is None  # a Braille blank, an emoji: visible


def test_minilm_gives_them_no_token(minilm_spec):
    """Why they are no text: the packaged model's tokenizer has nothing to embed for them but [CLS] [SEP] (or an
    [UNK] for the Hangul fillers), the same for every such row."""
    from petal.pipeline.ingest.tokens import TextTokenizer

    tokenizer = TextTokenizer(minilm_spec.tokenizer_file, 32)
    texts = ["\u00ad", "\ufe0f\ufe0f", "\U000e0041\U000e0042", "\u034f", "\U0001d173"]
    encoded = tokenizer.encode(texts).token_ids
    assert {tuple(ids) for ids in encoded} == {tuple(encoded[0])} and len(encoded[0]) == 2


def index_rows(tmp_path: Path, minilm_dir: Path, texts: list[str]) -> dict:
    """``petal index`` of one shard of ``texts`` (ids 0, 1, ...) into ``tmp_path/out``: its report's row counts."""
    shard = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": pa.array(range(len(texts)), pa.int64()), "text": texts}), shard)
    report = tmp_path / "report.json"
    result = CliRunner().invoke(cli, ["index", str(shard), "--out", str(tmp_path / "out"), "--model", str(minilm_dir),
                                      "--device", "cpu", "-q", "--json-report", str(report)])
    assert result.exit_code == 0, result.output
    return json.loads(report.read_text())["rows"]


def test_petal_index_skips_and_counts_rows_of_them(tmp_path: Path, minilm_dir: Path):
    texts = ["\u00ad", "\ufe0f\ufe0f", "\U000e0041\U000e0042", "\u3164 \u115f", "real words about glaciers",
             "\u00adsoft\u00adhyphen\u00ad"]
    rows = index_rows(tmp_path, minilm_dir, texts)
    assert rows["skipped"] == {"empty_text": 4} and rows["embedded"] == 2
    ids, _ = live(tmp_path / "out")
    assert sorted(ids) == [4, 5]


@pytest.mark.parametrize("text", ["\u00ad\u00ad", "\ufe0f", "\U000e0020"])
def test_petal_embed_skips_them(tmp_path: Path, minilm_dir: Path, text: str):
    result = CliRunner().invoke(cli, ["embed", "--model", str(minilm_dir), "--device", "cpu", "ok", text])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line.get("skipped") for line in lines] == [None, "empty_text"]
