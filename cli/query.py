"""``petal query INDEX [TEXT...]``: embed queries with the index's model and search."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from petal.cli.common import (
    MODEL_DIR,
    PATH,
    device_options,
    float32_value,
    given_flags,
    json_text,
    once_option,
    require_stdout,
    startup_done,
    stdin_lines,
    unused_flags,
    usage,
    user_errors,
    write_stdout,
)
from petal.cli.options import loading_options
from petal.pipeline.index.bounds import MAX_K, MAX_NPROBE, MAX_RESCORE
from petal.pipeline.reliability.errors import one_line, quote_path, quote_text

if TYPE_CHECKING:
    from petal.pipeline.index.search import Hit
    from petal.pipeline.jobs.searcher import Index

# --vector-file: rows searched at once (this many hits at most: rows = VECTOR_CHUNK_HITS // k), and the answers held
# between the pass that checks every row and the pass that writes them (a longer file is searched twice)
VECTOR_CHUNK_HITS = 1 << 16
HELD_HITS = 1 << 18
# NOTE: the flags of the query model (loaded to embed TEXT and --stdin lines): --vector-file runs none, so given
# with it they would set nothing: refused (2), never silently ignored (the rule of petal serve's MODEL_FLAGS)
MODEL_FLAGS = ("model", "device", "dtype", "attention", "query_prompt", "allow_pickle_weights")


@click.command()
@click.argument("index_path", metavar="INDEX", type=PATH)
@click.argument("texts", nargs=-1)
@click.option("-k", "k", type=click.IntRange(min=1, max=MAX_K), default=10, show_default=True, help="Hits per query.")
@click.option("--stdin", "from_stdin", is_flag=True, help="One query per input line, model kept warm.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines on stdout (one per query).")
@click.option("--show-text", is_flag=True,
              help="Print each hit's text (the text stored with the index; from the hit's shard for an index "
                   "built before text was stored).")
@once_option("--vector-file", type=PATH, join="stack the queries in one [n, dim] .npy", metavar="Q.npy",
             help="Query by vectors ([n, dim] or [dim] .npy) instead of text: no model (any index; the way to "
                   "query one built with --vectors-column).")
@once_option("--where", join="join the conditions with AND", metavar="EXPR",
              help="Only documents matching EXPR, on --keep-columns: \"lang = 'en' AND year IN (2020, 2021)\" "
                   "(applied inside the FAISS search). Literals: 'strings', numbers, true, false, a quoted ISO "
                   "date or time ('2024-01-31') for date, time and timestamp columns; each of its column's kind "
                   "(topic = 5 on a string column is an error). A column name that is not a plain word goes in double "
                   "quotes, a quote in it doubled: \"first name\" = 'Ada'.")
@click.option("--model", type=MODEL_DIR, default=None, metavar="PATH|HF_ID",
              help="The index's model, if it moved since indexing (weights must match): a local model directory, "
                   "or a Hugging Face model id already in the local cache.")
@click.option("--nprobe", type=click.IntRange(min=1, max=MAX_NPROBE), default=None,
              help="Override the tuned IVF nprobe.")
@click.option("--rescore", type=click.IntRange(min=0, max=MAX_RESCORE), default=None,
              help="Binary indexes: re-rank N x k Hamming candidates with float vectors (default 10; 0: Hamming only).")
@device_options
@loading_options
@user_errors(outputs=())
def query(index_path: Path, texts: tuple[str, ...], k: int, from_stdin: bool, as_json: bool, show_text: bool,
          vector_file: Path | None, where: str | None, model: str | None, nprobe: int | None, rescore: int | None,
          device: str, dtype: str,
          attention: str, query_prompt: str | None, allow_pickle_weights: bool) -> None:
    """Search INDEX (an output directory or a version directory) for TEXT.

    Queries get the index's model, pooling, attention, output transform (--dim, --quantize) and query
    prompt, as recorded in its manifest. Bytes that are not UTF-8 (in TEXT or a --stdin line) are read
    as U+FFFD, counted on stderr, and the query is answered; a blank TEXT or --stdin line, or one whose
    every character the model's tokenizer drops (combining marks, U+FFFD under MiniLM), is skipped,
    answered in its place as skipped ({"query": "", "hits": [], "skipped": "empty_text"} with --json), so
    the answers line up with the arguments and lines (those before the first query answered are written
    with its answer).

    No query to answer is no input, exit 66 (as petal embed): an empty --stdin, one of skipped lines
    only, skipped TEXT only, or a --vector-file without rows. A --vector-file that is missing, not a
    regular file or unreadable is 66 too; one that is not [n, dim] finite numbers is 65.

    A --vector-file query runs no model: the model's flags (--model, --device, --dtype, --attention,
    --query-prompt, --allow-pickle-weights) given with it are a usage error (2), not ignored.
    """
    # NOTE: what the flags alone decide is checked before the index opens (no FAISS, torch or Arrow for a usage error)
    if vector_file is not None and (texts or from_stdin):
        raise click.UsageError("--vector-file replaces query TEXT and --stdin: give one of them")
    if vector_file is None and not texts and not from_stdin:
        raise click.UsageError("give query TEXT, --stdin or --vector-file")
    unused = given_flags(MODEL_FLAGS) if vector_file is not None else []
    if unused:
        raise unused_flags(unused, "--vector-file searches with the file's vectors and runs no model",
                           "leave {them} out")
    if where is not None:
        from petal.pipeline.index.filters import parse_filter

        usage(lambda: parse_filter(where))  # a malformed expression; unknown columns are known once the index opens
    require_stdout("petal query")  # NOTE: stdout closed at start: 74, not answers to /dev/null and exit 0
    # NOTE: then the input file (missing, unreadable, empty: 66; not vectors: 65), still before the index opens
    vectors = read_vector_file(vector_file) if vector_file is not None else None
    _judged_by_manifest(index_path, where, by_text=vector_file is None)
    from petal.pipeline.api import open_index

    index = open_index(index_path, model=model, device=device, dtype=dtype, attention=attention, nprobe=nprobe,
                       rescore=rescore, query_prompt=query_prompt, allow_pickle_weights=allow_pickle_weights)
    if index.reader.open_check.note:
        click.echo(f"petal query: note: {index.reader.open_check.note}", err=True)
    if vectors is not None:
        startup_done()  # the index is open: what follows collects garbage as usual
        _by_vectors(index, vectors, quote_path(vector_file), k, as_json, show_text, where)
        return
    if where is not None:
        index.check_where(where)  # an unknown column: exit 2, before the model loads
    if index.manifest.precomputed:
        index.query_model()  # NOTE: raises: a text query on an index without a model is a usage error (2)
    from petal.pipeline.ingest.text_rule import skip_reason, valid_text
    from petal.pipeline.reliability.errors import Interrupted, NoInputError, PetalError

    # NOTE: the rule of petal index and petal embed: an invisible query (empty, blank) is skipped and said;
    # bytes that are not UTF-8 (argv, stdin) are read as U+FFFD and counted: one bad line never ends the stream
    replaced = 0
    cleaned = [valid_text(t) for t in texts]
    replaced += sum(bad for _, bad in cleaned)
    texts = tuple(t for t, _ in cleaned)
    asked = [t for t in texts if skip_reason(t) is None]
    if not asked and not from_stdin:  # NOTE: every query given is blank: no input (66), before the model loads
        _say_skipped(texts)
        _say_replaced(replaced)
        raise NoInputError(f"nothing to query: {_blank_texts(len(texts))}")
    try:
        index.query_model()  # loaded before the first query: a model that is gone fails at once
    except (PetalError, click.ClickException) as exc:
        if asked or not from_stdin or isinstance(exc, Interrupted):
            raise
        # NOTE: the rule of petal embed --stdin: the model's error stands only once a query arrives; a stdin that ends
        # without one is no input (66), whatever the model (was: 78 for an empty stdin and a missing --model)
        _query_arrives(texts)
        raise
    startup_done()  # index and model loaded: what follows (a --stdin stream) collects garbage as usual
    for note in index.notes:
        click.echo(f"petal: note: {note}", err=True)
    _say_skipped(texts)
    # NOTE: every TEXT gets its answer in its place, a blank one as skipped (the answers no longer lined up with the
    # arguments); those of blank TEXT only, before a --stdin stream, are held and written with its first answer
    held: list[str] = []
    answered = 0
    if asked:
        # NOTE: every TEXT is embedded and searched before the first answer is written; a query the model embeds to
        # NaN is named by its place among the TEXT arguments (Index.search), nothing written
        results = index.search(list(texts), k, where=where)
        unseen = _unseen(index, list(texts), results)
        for i in sorted(unseen):
            click.echo(f"petal: skipped query {i} ({UNSEEN})", err=True)
        answered = len(asked) - len(unseen)
        if not answered and not from_stdin:  # NOTE: no query left to answer: no input (66), as blank TEXT only
            _say_replaced(replaced)  # (the count was said only after answers: missing from this exit)
            raise NoInputError(f"nothing to query: {_blank_texts(len(texts), len(unseen))}")
        reasons = [skip_reason(t) or ("empty_text" if i in unseen else None) for i, t in enumerate(texts)]
        rendered = _rendered(index, list(texts), results, as_json, show_text, where, skipped=reasons)
        if answered:
            _write(rendered)
        else:
            held = rendered
    else:
        for text in texts:
            held = _skipped_answer(held, text, "empty_text", as_json, False)
    unseen_texts = len(asked) - answered
    skipped = non_finite = unseen_lines = 0
    if from_stdin:
        from petal.pipeline.jobs.query import NonFiniteQueryError

        # NOTE: a skipped line gets an answer that says so, in its place (a coprocess that writes a line and waits
        # for its answer waited forever on a blank one, and answers no longer lined up with the lines); those
        # before the first answer are held and written with it, so input that holds no query writes nothing (66)
        for raw in stdin_lines():  # one query at a time: answers stream as lines arrive
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                line = raw.decode("utf-8", "replace")
                replaced += 1
            if skip_reason(line) is None:
                index = _followed(index, where)
                try:
                    results = index.search([line], k, where=where)
                    if _unseen(index, [line], results):
                        # NOTE: the rule of petal index and petal embed (empty_text): a line the model sees as empty
                        # is skipped and said, as a blank one; its hits would be an empty text's, whatever it holds
                        unseen_lines += 1
                        click.echo(f"petal query: skipped --stdin line {quote_text(line)} ({UNSEEN})", err=True)
                        held = _skipped_answer(held, line, "empty_text", as_json, answered > 0)
                        continue
                    rendered = _rendered(index, [line], results, as_json, show_text, where)
                except NonFiniteQueryError:
                    # NOTE: a stream: one line the model cannot embed is skipped and said, as a blank one; the
                    # session goes on (the lines before it were answered as they came)
                    non_finite += 1
                    click.echo(f"petal query: skipped --stdin line {quote_text(line)}: it embeds to NaN or infinite "
                               "values with this model (non_finite_embedding)", err=True)
                    held = _skipped_answer(held, line, "non_finite_embedding", as_json, answered > 0)
                    continue
                _write(held + rendered)
                held = []
                answered += 1
            else:
                skipped += 1
                held = _skipped_answer(held, line, "empty_text", as_json, answered > 0)
        if skipped:
            click.echo(f"petal: {skipped} stdin line{'s' if skipped > 1 else ''} skipped (empty_text: blank lines "
                       "are not queries)", err=True)
        if unseen_lines:
            click.echo(f"petal: {unseen_lines} stdin line{'s' if unseen_lines > 1 else ''} skipped ({UNSEEN})",
                       err=True)
        if non_finite:
            click.echo(f"petal: {non_finite} stdin line{'s' if non_finite > 1 else ''} skipped (non_finite_embedding)",
                       err=True)
    _say_replaced(replaced)
    truncated = index.num_truncated  # NOTE: never loads the model again
    if truncated:  # the rule of petal index and petal embed: a truncated text is counted and said
        warm = index.query_model().model
        # NOTE: a text cut at the characters petal reads (one huge unknown word) is not longer than max_tokens
        long, at_tokens = index.num_over_chars, truncated - index.num_over_chars
        if at_tokens:
            click.echo(f"petal query: {at_tokens} quer{'y' if at_tokens == 1 else 'ies'} longer than "
                       f"{warm.max_tokens} tokens, truncated", err=True)
        if long:
            click.echo(f"petal query: {long} quer{'y' if long == 1 else 'ies'} longer than the "
                       f"{warm.tokenizers['query'].max_text_chars} characters petal reads of a text, truncated",
                       err=True)
    if not answered:
        # NOTE: the rule of petal embed (and of a --vector-file without rows): an input given that holds no query
        # is no input (66), so a cron job or an Airflow task whose upstream wrote nothing fails, not succeeds
        said = ["--stdin is empty" if not skipped + non_finite + unseen_lines else
                f"--stdin held only blank lines ({skipped})" if not non_finite + unseen_lines else
                "--stdin held only lines skipped (" + ", ".join(f"{name} {count}" for name, count in (
                    ("blank", skipped), ("nothing the model sees", unseen_lines),
                    ("non_finite_embedding", non_finite)) if count) + ")"]
        if texts:
            said.append(_blank_texts(len(texts), unseen_texts))
        raise NoInputError(f"nothing to query: {'; '.join(said)}")


def _say_replaced(replaced: int) -> None:
    """The count of queries whose bytes were not UTF-8 (read as U+FFFD), on stderr."""
    if replaced:
        click.echo(f"petal query: {replaced} quer{'y' if replaced == 1 else 'ies'} held bytes that are not UTF-8, "
                   "read as U+FFFD", err=True)


def _query_arrives(texts: tuple[str, ...]) -> None:
    """Reads ``--stdin`` until a query (a line not blank) arrives, or raises ``NoInputError`` (66) at its end."""
    from petal.pipeline.ingest.text_rule import skip_reason
    from petal.pipeline.reliability.errors import NoInputError

    blank = 0
    for raw in stdin_lines():
        if skip_reason(raw.decode("utf-8", "replace")) is None:
            return
        blank += 1
    said = [f"--stdin held only blank lines ({blank})" if blank else "--stdin is empty"]
    if texts:
        said.append(_blank_texts(len(texts)))
    raise NoInputError(f"nothing to query: {'; '.join(said)}")


def _judged_by_manifest(index_path: Path, where: str | None, by_text: bool) -> None:
    """The usage errors the index's manifest alone decides (a text query on an index of precomputed vectors, a
    ``--where`` on a column it does not keep or on a binary index): exit 2 before FAISS, Arrow or torch load (they
    came after the index opened). A manifest that cannot be read is left to the open, which says why and retries a
    version pruned meanwhile; the open judges the same again (the version it opens may be a newer one)."""
    import os

    from petal.pipeline.index.filters import columns_problem, parse_filter
    from petal.pipeline.layout import resolve_index_dir
    from petal.pipeline.reliability.errors import PetalError, UsageError

    try:
        version_dir, manifest = resolve_index_dir(index_path)
    except (PetalError, OSError):
        if not os.path.lexists(index_path):  # NOTE: nothing there to retry (a typo): said before Arrow loads
            raise
        return
    refusal = manifest.text_query_refusal(version_dir) if by_text else None
    if where is not None and refusal is None:
        refusal = columns_problem(parse_filter(where), manifest.kept_columns, manifest.stored is not None,
                                  manifest.binary_index)
    if refusal is not None:
        raise UsageError(refusal)


def _say_skipped(texts: tuple[str, ...]) -> None:
    from petal.pipeline.ingest.text_rule import skip_reason

    for i, text in enumerate(texts):
        if skip_reason(text) is not None:
            click.echo(f"petal: skipped query {i} ({skip_reason(text)})", err=True)


# why a query the model sees as empty is skipped: its ids are an empty text's (TextTokenizer.sees_nothing)
UNSEEN = "empty_text: the model's tokenizer drops every character of it, so it holds nothing to search for"


def _blank_texts(count: int, unseen: int = 0) -> str:
    """Why no TEXT is a query: ``count`` of them, ``unseen`` of which hold only characters the model drops."""
    if not unseen:
        return "the query TEXT is blank" if count == 1 else f"all {count} query TEXTs are blank"
    if count == 1:
        return "the query TEXT holds only characters the model's tokenizer drops"
    if unseen == count:
        return f"all {count} query TEXTs hold only characters the model's tokenizer drops"
    return (f"all {count} query TEXTs are blank ({count - unseen}) or hold only characters the model's tokenizer "
            f"drops ({unseen})")


def _unseen(index: Index, texts: list[str], results: list[list[Hit]]) -> set[int]:
    """The places of the queries (not blank) that ``Index.search`` answered with no hits because the model sees them
    as empty (``QueryService.unseen``), not for want of a match; asked of the hitless ones only."""
    from petal.pipeline.ingest.text_rule import skip_reason

    hitless = [i for i, hits in enumerate(results) if not hits and skip_reason(texts[i]) is None]
    if not hitless:
        return set()
    return {hitless[j] for j in index.query_model().unseen([texts[i] for i in hitless])}


def _write(lines: list[str]) -> None:
    write_stdout(lines, flush=True)


def _skipped_answer(held: list[str], line: str, reason: str, as_json: bool, answered: bool) -> list[str]:
    """A skipped ``--stdin`` line's (or TEXT's) answer: written now once a query was answered, else added to ``held``
    (returned: what is still held)."""
    lines = _skipped_lines(line, reason, as_json)
    if answered:
        _write(lines)
        return held
    return held + lines


def _skipped_lines(query: str, reason: str, as_json: bool) -> list[str]:
    """A skipped query's answer: JSON ``{"query": ..., "hits": [], "skipped": reason}``, text ``(skipped: reason)``."""
    if as_json:
        return [_json_line({"query": query, "hits": [], "skipped": reason})]
    return [f"query: {one_line(query)}", f"   (skipped: {reason})"]


def _rendered(index: Index, labels: list[str], results: list[list[Hit]], as_json: bool, show_text: bool,
              where: str | None, skipped: list[str | None] | None = None) -> list[str]:
    """The lines of each query's answer (``labels``: the query as said, its text or "vector N"), plain or JSON;
    ``skipped``: each query's skip reason (``None``: answered), a skipped one answered as such in its place."""
    width = shutil.get_terminal_size((100, 20)).columns
    lines: list[str] = []
    stored = None
    columns = index.reader.columns
    if show_text and columns is not None and "text" in columns.names:
        # NOTE: text stored with the index: every hit's at once (one read per row group, not one per query: a
        # --vector-file of 50k rows read its text row groups 50k times). Text read back from shards stays per query,
        # so gone shards are found, and warned about, in the order they always were
        every = index.texts([hit for hits in results for hit in hits])
        stored = iter(every)
    for i, (text, hits) in enumerate(zip(labels, results)):
        reason = None if skipped is None else skipped[i]
        if reason is not None:
            lines.extend(_skipped_lines(text, reason, as_json))
            continue
        if stored is not None:
            texts: list[str | None] = [next(stored) for _ in hits]
        else:
            texts = index.texts(hits) if show_text else [None] * len(hits)
        if as_json:
            rows = []
            for hit, hit_text in zip(hits, texts):
                # NOTE: the score at the shortest text that reads back as FAISS's float32 (was rounded to 6 decimals)
                row = {"rank": hit.rank, "score": float32_value(hit.score), "id": hit.id, "shard": hit.shard,
                       "row": hit.row}
                if hit.fields:
                    row["fields"] = {k: _field_value(v) for k, v in hit.fields.items()}
                if show_text:
                    row["text"] = hit_text
                    why = _missing(index, hit.shard) if hit_text is None else None
                    if why is not None:
                        row["text_missing"] = f"shard {why}"
                rows.append(row)
            _warn_missing(index)
            lines.append(_json_line({"query": text, "hits": rows}))
            continue
        _warn_missing(index)
        lines.append(f"query: {one_line(text)}")
        lines.append(f"{'rank':>4}  {'score':>8}  id")
        for hit, hit_text in zip(hits, texts):
            line = f"{hit.rank:>4}  {hit.score:>8.4f}  {one_line(str(hit.id))}"
            if hit.fields:
                line += "  " + one_line(" ".join(f"{k}={_field_value(v)}" for k, v in hit.fields.items()))
            if show_text and hit_text is not None:
                # NOTE: a shard's text is untrusted: its control characters (terminal escapes, NUL) are escaped as the
                # id's and the kept columns' are, never written to a terminal as they are
                snippet = one_line(" ".join(hit_text.split()))
                room = max(20, width - len(line) - 4)
                line += "  " + (snippet[: room - 1] + "…" if len(snippet) > room else snippet)
            lines.append(line)
        if not hits:
            why = f"no row matches --where {one_line(where)}" if where else \
                "the index is empty" if index.reader.ntotal == 0 else "none found"
            lines.append(f"   (no hits: {why})")
    return lines


def _field_value(value: Any) -> Any:
    """A kept column's value as ``petal query`` shows it: a duration as ISO 8601 (``iso_duration``), a decimal
    positional (``plain_decimal``, as ``--json`` and ``petal serve`` write it), the rest as it is."""
    import datetime as dt
    from decimal import Decimal

    from petal.pipeline.serve.encoding import iso_duration, plain_decimal

    if isinstance(value, Decimal):
        return plain_decimal(value)
    return iso_duration(value) if isinstance(value, dt.timedelta) else value


def _json_line(answer: dict[str, Any]) -> str:
    """One query's ``--json`` line: a ``--keep-columns`` float that is NaN or infinite as ``null``, as ``petal serve``
    answers it; other values JSON has no type for as ``petal serve`` writes them (``json_default``).

    NOTE: ``json.dumps`` writes NaN and Infinity, which no strict JSON reader takes (jq, JSON.parse, orjson)."""
    from petal.pipeline.serve.encoding import _finite, json_default

    try:
        return json_text(answer, default=json_default, allow_nan=False)
    except ValueError:
        return json_text(_finite(answer), default=json_default)


def _followed(index: Index, where: str | None) -> Index:
    """A ``--stdin`` session moves on to each version published while it runs, as a new ``petal query`` would; one
    that cannot be opened (or searched with ``--where``) is said on stderr, and the session keeps the version it
    has."""
    from petal.pipeline.reliability.errors import PetalError

    try:
        fresh = index.reopened(where)
    except PetalError as exc:
        click.echo(f"petal query: warning: a new version was published but cannot be searched ({one_line(str(exc))}); "
                   f"still answering from {index.path.name}", err=True)
        return index
    if fresh is None:
        return index
    click.echo(f"petal query: note: answering from {fresh.path.name}, published during this session", err=True)
    index.close()  # NOTE: its lease goes now, so the next petal index run may prune the version left behind
    return fresh


def _missing(index: Index, shard: str) -> str | None:
    """Why the hits of ``shard`` have no text ("gone", "changed", "unreadable"), or ``None``."""
    from petal.pipeline.index.search import shard_locations

    reader = index.reader
    return reader.missing_shards.get(shard_locations(reader.manifest).get(shard, shard))


MISSING_SAID = {"gone": "is gone (moved or deleted)",
                "changed": "has changed since it was indexed (its rows no longer hold the indexed ids)",
                "unreadable": "cannot be read"}


def _warn_missing(index: Index) -> None:
    """Once per shard: its hits have no text because it is gone, changed or unreadable (an index without stored
    text)."""
    warned = index.__dict__.setdefault("_warned_missing", set())
    for shard in sorted(set(index.reader.missing_shards) - warned):
        warned.add(shard)
        said = MISSING_SAID[index.reader.missing_shards[shard]]
        click.echo(f"petal: warning: {quote_path(shard)} {said}, so --show-text has no text for its hits; "
                   "indexes built now store the text", err=True)


def read_vector_file(path: Path) -> Any:
    """``--vector-file``: a ``.npy`` of ``[n, dim]`` or ``[dim]`` real vectors (integers or floats), as float32;
    integer and bool arrays as they are (a quantized index's own codes: the index decides, ``query_vectors``).

    The rule of every input file (``petal embed --input`` too): one that is missing, not a regular file (a
    directory, a FIFO) or unreadable is no input (``NoInputError``, 66), as is one that holds no vectors (0 bytes,
    or shape ``[0, dim]``); one whose bytes are not such vectors (not a ``.npy``, a ``.npz`` archive, complex values,
    NaN, infinity or a value beyond float32's range) is bad input (``BadInputError``, 65), both
    naming the file. Neither is a usage error: the flag's value, a path, is fine."""
    import numpy as np

    from petal.pipeline.reliability.errors import BadInputError, NoInputError
    from petal.pipeline.reliability.safe_files import input_file_size

    where = f"--vector-file {quote_path(path)}"
    if input_file_size("--vector-file", path) == 0:
        raise NoInputError(f"{where} is empty (0 bytes): no vectors")
    try:
        with open(path, "rb") as fh:
            # NOTE: np.load takes a file without the .npy magic (text, Parquet, ...) for a pickle and says "contains
            # pickled (object) data ... load it unsafely": the wrong story (and advice) for a file that is no .npy
            magic = fh.read(6)
            if magic != b"\x93NUMPY" and not magic.startswith(b"PK\x03\x04"):  # PK: a .npz, said below
                raise BadInputError(f"{where}: not a .npy file (it does not start with the .npy magic bytes; write "
                                    "one with numpy.save)")
            fh.seek(0)
            vectors = np.load(fh, allow_pickle=False)
            if not isinstance(vectors, np.ndarray):  # NOTE: np.load opens a .npz (a zip of arrays) as an NpzFile
                vectors.close()
                raise BadInputError(f"{where}: a .npz archive, not one .npy array (np.save one array of shape "
                                    "[n, dim])")
    except (OSError, ValueError, EOFError) as exc:  # NOTE: a truncated header is an EOFError
        raise BadInputError(f"{where}: not a readable .npy file ({one_line(str(exc))[:200]})") from exc
    shape = vectors.shape  # NOTE: as the file holds it (a [dim] vector is read as [1, dim] below)
    if vectors.ndim == 1:
        vectors = vectors[None, :]
    if vectors.ndim == 2 and vectors.shape[0] == 0:
        # NOTE: the rule of petal embed: an input given that holds nothing is no input (66)
        raise NoInputError(f"{where} holds no vectors (shape {vectors.shape})")
    if vectors.ndim != 2 or vectors.dtype.kind not in "iufb":
        raise BadInputError(f"{where}: expected real numbers (integers or floats) of shape [n, dim] or [dim], got "
                            f"{shape} {vectors.dtype}")
    if vectors.dtype.kind in "iub":
        # NOTE: integers and booleans go as they are: a quantized index takes its own codes (int8 codes, packed or
        # bool sign bits) and a binary one refuses unsigned values; the index, open next, decides
        # (Index.query_vectors). Every such value is finite as float32
        return vectors
    with np.errstate(over="ignore"):  # float64 beyond float32's range becomes inf, refused below
        as_float32 = vectors.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(as_float32).all(axis=1))
    if len(bad):
        raise BadInputError(f"{where}: row {bad[0]} holds NaN, infinite values or values beyond float32's range")
    return as_float32


def _by_vectors(index: Index, vectors: Any, vector_file: str, k: int, as_json: bool, show_text: bool,
                where: str | None) -> None:
    from petal.pipeline.jobs.searcher import QueryVectorsError, ScoresOverflowError
    from petal.pipeline.reliability.errors import BadInputError

    try:
        vectors = index.query_vectors(vectors)  # int8 codes, sign bits: as the index stores them
    except QueryVectorsError as exc:  # NOTE: the file's data, not a flag: 65 naming the file
        raise BadInputError(f"--vector-file {vector_file}: {exc}") from exc
    for note in index.notes:
        click.echo(f"petal: note: {note}", err=True)
    if where is not None:
        index.check_where(where)
    step = max(1, VECTOR_CHUNK_HITS // max(1, min(k, index.num_vectors)))
    starts = range(0, len(vectors), step)

    def search(start: int) -> list[list[Hit]]:
        try:
            return index.search_stored(vectors[start:start + step], k, where)
        # NOTE: the file's data (or a stored vector too large to score, the index's data), not a flag: 65 naming the
        # file and row
        except ScoresOverflowError as exc:
            raise BadInputError(f"--vector-file {vector_file}: row {start + exc.row}: {exc.reason}") from exc

    # NOTE: every row is searched, and its scores checked, before the first answer is written: a file with a row
    # refused (65) prints nothing, in every output format. The answers found are held up to HELD_HITS; the chunks
    # of a longer file are searched again as they are written (the same rows of the same index: the same
    # answers), so memory does not grow with the file
    held: list[list[list[Hit]]] = []
    held_hits = 0
    for start in starts:
        found = search(start)
        held_hits += sum(map(len, found))
        if held_hits <= HELD_HITS:
            held.append(found)
    for chunk, start in enumerate(starts):
        found = held[chunk] if chunk < len(held) else search(start)
        _write(_rendered(index, [f"vector {row}" for row in range(start, start + len(found))], found, as_json,
                         show_text, where))
        if chunk < len(held):
            held[chunk] = []  # written: let it go
