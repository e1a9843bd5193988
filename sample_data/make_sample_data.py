"""Build petal's sample Parquet shards from corpus.tsv.

Usage: python sample_data/make_sample_data.py

Reads corpus.tsv (topic<TAB>title<TAB>text, one document per line) from this
script's folder and writes shard-000.parquet, shard-001.parquet and
shard-002.parquet next to it. Documents are dealt round-robin in corpus order
(document i goes to shard i % 3), then a fixed set of deliberately bad rows is
inserted at fixed positions. Nothing here depends on time, randomness or the
environment, so two runs give byte-identical files.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus.tsv"
NUM_SHARDS = 3
ROW_GROUP_SIZE = 50
MIN_LONG, MAX_LONG = 15_000, 30_000

SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=True),
        pa.field("topic", pa.string(), nullable=False),
    ]
)

# Text for the duplicate-id row: normal, readable, and different from the row whose id it reuses.
DUPLICATE_TEXT = (
    "Lighthouses once relied on keepers who trimmed wicks and wound clockwork every few hours through "
    "the night. A Fresnel lens, built from rings of glass prisms, gathers the light of a small lamp into "
    "a beam visible many kilometers out to sea. Most lighthouses are now automated, and their distinctive "
    "flashing patterns still tell sailors exactly which light they are looking at."
)

# (shard, 0-based row position in the final shard, kind, extra). Positions are applied in ascending
# order per shard, so each is the row's final index. "dup" reuses the id found at row `extra`.
BAD_ROWS: list[tuple[int, int, str, object]] = [
    (0, 5, "null", None),
    (0, 77, "long", "programming"),
    (0, 100, "dup", 10),
    (1, 12, "empty", None),
    (1, 58, "whitespace", None),
    (1, 90, "long", "ml"),
    (2, 33, "null", None),
    (2, 70, "empty", None),
]

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def read_corpus(path: Path) -> list[tuple[str, str, str]]:
    docs = []
    with path.open(encoding="utf-8", newline="\n") as fh:
        for lineno, line in enumerate(fh, start=1):
            line = line.rstrip("\n")
            if not line:
                continue
            parts = line.split("\t")
            if len(parts) != 3 or not all(p.strip() for p in parts):
                sys.exit(f"{path.name}:{lineno}: expected 3 non-empty tab-separated fields")
            docs.append((parts[0], parts[1], parts[2]))
    return docs


def long_text(docs: list[tuple[str, str, str]], topic: str) -> str:
    """Join every distinct sentence of one topic's documents, in corpus order."""
    seen: dict[str, None] = {}
    for doc_topic, _title, text in docs:
        if doc_topic == topic:
            for sentence in SENTENCE_END.split(text):
                seen.setdefault(sentence.strip(), None)
    text = " ".join(s for s in seen if s)
    if not MIN_LONG <= len(text) <= MAX_LONG:
        sys.exit(f"long row for topic {topic!r} has {len(text)} chars, want {MIN_LONG}..{MAX_LONG}")
    return text


def build_shards(docs: list[tuple[str, str, str]]) -> list[list[dict]]:
    shards: list[list[dict]] = [[] for _ in range(NUM_SHARDS)]
    for i, (topic, title, text) in enumerate(docs):
        shards[i % NUM_SHARDS].append({"id": f"doc-{i:05d}", "title": title, "text": text, "topic": topic})

    next_id = len(docs)
    for shard, pos, kind, extra in sorted(BAD_ROWS, key=lambda r: (r[0], r[1])):
        rows = shards[shard]
        if kind == "dup":
            assert isinstance(extra, int) and extra < pos
            row = {
                "id": rows[extra]["id"],
                "title": "Duplicate id: lighthouse keepers",
                "text": DUPLICATE_TEXT,
                "topic": "bad-row",
            }
        else:
            row_id = f"doc-{next_id:05d}"
            next_id += 1
            if kind == "null":
                row = {"id": row_id, "title": "Bad row: null text", "text": None, "topic": "bad-row"}
            elif kind == "empty":
                row = {"id": row_id, "title": "Bad row: empty text", "text": "", "topic": "bad-row"}
            elif kind == "whitespace":
                row = {
                    "id": row_id,
                    "title": "Bad row: whitespace-only text",
                    "text": "   \n\t ",
                    "topic": "bad-row",
                }
            elif kind == "long":
                row = {
                    "id": row_id,
                    "title": f"Long document: all {extra} sentences",
                    "text": long_text(docs, str(extra)),
                    "topic": "long",
                }
            else:
                raise ValueError(kind)
        rows.insert(pos, row)
    return shards


def main() -> None:
    docs = read_corpus(CORPUS)
    shards = build_shards(docs)
    for n, rows in enumerate(shards):
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        out = HERE / f"shard-{n:03d}.parquet"
        pq.write_table(table, out, row_group_size=ROW_GROUP_SIZE, compression="zstd")
        print(f"{out.name}: {table.num_rows} rows")


if __name__ == "__main__":
    main()
