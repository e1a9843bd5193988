"""``petal embed [TEXT...]``: one-shot embeddings, in input order, to JSON lines or ``.npy``."""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click

from petal.cli.common import (
    MODEL_DIR,
    PATH,
    device_options,
    float_row_text,
    given_flags,
    once_option,
    require_stdout,
    startup_done,
    stdin_chunks,
    user_errors,
    write_stdout,
)
from petal.cli.options import model_options, output_options
from petal.pipeline.reliability.output_file import check_output_file as check_output
from petal.pipeline.reliability.output_file import write_error
from petal.pipeline.reliability.safe_files import name_suffix

if TYPE_CHECKING:
    import numpy as np

    from petal.pipeline.jobs.embed import Embedded, Embedder


TextsT = TypeVar("TextsT", bound=list)


@click.command()
@click.argument("texts", nargs=-1)
@click.option("--model", type=MODEL_DIR, default=None, metavar="PATH|HF_ID",
              help="Local model directory, or a Hugging Face model id already in the local cache (default: the "
                   "packaged all-MiniLM-L6-v2).")
@click.option("--stdin", "from_stdin", is_flag=True,
              help="Read one text per line from stdin. Alone (no TEXT, --input, --output, or --quantize int8 without "
                   "--calibration), each JSON line is written and flushed as soon as its line is embedded, with the "
                   "lines that had arrived with it (a coprocess, tail -f); blank lines before the first text embedded "
                   "are answered with it. With any of those, all of stdin is read first.")
@once_option("--input", "input_path", type=PATH, join="give one file (one --input per petal embed run)",
             help="Read texts from a .parquet, .txt or .jsonl file.")
@click.option("--text-column", default="text", show_default=True,
              help="Text column of a .parquet --input (or key of a .jsonl one).")
@click.option("--id-column", default=None,
              help="Id column of a .parquet --input (or key of a .jsonl one): each output line carries its id.")
@click.option("--output", "output", type=PATH, default=None,
              help="Write FILE.npy (one row per input: float32 or --output-dtype float16 vectors, --quantize int8 "
                   "codes or packed sign bits) or FILE.jsonl instead of JSON lines on stdout: whole or not at "
                   "all (a file beside it renamed over it; on any failure an existing FILE is left as it was).")
@click.option("--max-length", type=int, default=None, help="Truncate texts to N tokens (default: the model's).")
@click.option("--query", "as_query", is_flag=True, help="Embed the texts as queries (with the query prompt).")
@click.option("--calibration", "calibration_index", type=PATH,
              default=None,
              help="--quantize int8 without a model scheme: use the per-dimension ranges of this index, built "
                   "with this model (as petal query matches it; another is exit 2) and --dim (default: learn them "
                   "from the texts being embedded).")
@device_options
@model_options
@output_options
@user_errors(outputs=("output",))
def embed(texts: tuple[str, ...], model: str | None, from_stdin: bool, input_path: Path | None, text_column: str,
          id_column: str | None, output: Path | None, max_length: int | None, as_query: bool,
          calibration_index: Path | None,
          device: str, dtype: str, attention: str, pooling: str | None, attention_mask: str | None,
          query_prompt: str | None, allow_pickle_weights: bool, dim: int | None, quantize: str,
          output_dtype: str) -> None:
    """Embed TEXT arguments, --stdin lines or an --input file; rows keep the input order.

    Rows are float vectors (--output-dtype), int8 codes (--quantize int8) or packed sign bits
    (--quantize binary: dim / 8 bytes, first dimension in the high bit).

    A text that is null, blank, not UTF-8 (in any input: TEXT, --stdin, a .txt, .jsonl or .parquet
    --input) or that the model turns into NaN or infinity is skipped in its place (a null JSON line, a NaN
    row), counted by reason on stderr.

    Nothing to embed is no input, exit 66 (as petal query): an empty --stdin or --input, one of blank
    lines only, every text skipped. An --input that is missing, not a regular file or unreadable is 66
    too; one that cannot be read as its format is 65.
    """
    from petal.pipeline.ingest.text_rule import describe_skips, utf8_or_bytes
    from petal.pipeline.ingest.texts import check_columns
    from petal.pipeline.reliability.errors import Interrupted, NoInputError, PetalError, UsageError, quote_path

    # NOTE: an empty column name names no column: a usage error (2), as petal index's, before the model loads (and
    # with TEXT arguments too). Was: --id-column "" read as no id column (the ids silently dropped, or an IndexError
    # traceback once the model had loaded), --text-column "" a 65 naming the file
    try:
        check_columns(text_column, id_column)
    except UsageError as exc:
        raise click.UsageError(str(exc)) from None
    if output is not None and name_suffix(output) not in (".npy", ".jsonl"):
        raise click.UsageError(f"--output {quote_path(output)}: expected a .npy or .jsonl file")
    if output is not None and id_column is not None and name_suffix(output) == ".npy":
        raise click.UsageError(f"--id-column: --output {quote_path(output)} holds the rows only, so the ids would "
                               "go nowhere: write --output FILE.jsonl (each line carries its id), or leave --id-column "
                               "out")
    if output is None:
        require_stdout("petal embed without --output")  # NOTE: the vectors' only way out (74, not exit 0)
    if output is not None:
        check_output(output)  # before the model loads and the texts are embedded, not after
        _check_not_input(output, input_path)
    if calibration_index is not None and quantize != "int8":
        raise click.UsageError("--calibration goes with --quantize int8")
    # NOTE: --text-column names a .parquet column or a .jsonl key; anywhere else it would set nothing, silently
    if given_flags(("text_column",)) and (input_path is None or name_suffix(input_path) == ".txt"):
        raise click.UsageError("--text-column goes with --input FILE.parquet or FILE.jsonl")
    items: list = list(texts)
    ids: list | None = None
    # NOTE: an --input (.parquet, .txt, .jsonl; TEXT, --stdin and learned int8 ranges aside) is read, embedded and
    # written a window at a time (a record batch, the lines of a piece of the file), to FILE.npy, FILE.jsonl or
    # stdout: host memory does not grow with the input (RELIABILITY.md promise 9)
    pieces = _input_pieces(input_path, text_column, id_column) \
        if input_path is not None and not items and not from_stdin \
        and name_suffix(input_path) in (".parquet", ".txt", ".jsonl") \
        and not (name_suffix(input_path) == ".txt" and id_column is not None) \
        and not (quantize == "int8" and calibration_index is None) else None
    if pieces is not None:
        input_batches = _judged(pieces, f"--input {quote_path(input_path)} is empty")  # no input (66) before the model
    elif input_path is not None:
        read, ids = _input_texts(input_path, text_column, id_column)
        ids = [None] * len(items) + ids if ids is not None else None
        items += read
    elif id_column is not None:
        raise click.UsageError("--id-column goes with --input FILE.parquet or FILE.jsonl")
    # NOTE: --stdin alone streams: each line answered as it arrives (a coprocess writes a line and waits for its
    # vector). --output is written whole or not at all, learned int8 ranges need every text, and TEXT and --input
    # rows come first: those read all of stdin first
    streamed = from_stdin and not items and input_path is None and output is None and not (
        quantize == "int8" and calibration_index is None)
    chunks = stdin_chunks() if streamed else None  # NOTE: a closed stdin is 66 before the model loads
    if from_stdin and not streamed:
        # NOTE: bytes, decoded line by line; a line that is not UTF-8 stays bytes
        items += [utf8_or_bytes(raw) for lines, _ in stdin_chunks() for raw in lines]
    if ids is not None:  # NOTE: a --stdin line has no id, as a TEXT argument: null, each row keeping its own
        ids += [None] * (len(items) - len(ids))
    # NOTE: every input, one rule (petal index's, Embedder's): a text that is not UTF-8 (bytes; a TEXT argument that
    # Python read with surrogates for its bad bytes) is skipped in its place as invalid_utf8 or lone_surrogate, as a
    # null or blank one, and counted on the last line of stderr: never embedded as U+FFFD, never a shifted row
    if not items and not streamed and pieces is None:
        if input_path is None and not from_stdin:
            raise UsageError("nothing to embed: give TEXT, --stdin or --input")
        # NOTE: an input was given and held nothing: no input (66), as one of blank lines only; not a usage error
        source = "--stdin" if input_path is None else f"--input {quote_path(input_path)}"
        raise NoInputError(f"nothing to embed: {source} is empty")

    import numpy as np

    from petal.pipeline.jobs.embed import Embedder, skipped_texts

    # NOTE: no input (66) outranks what the model's loading says (a missing or bad --model: 78, an unreadable model
    # file: 66, --dim too wide: 2), as petal index judges its sources and petal query its TEXT before the model: an
    # input of blank, null or undecodable texts only is judged here, before the model loads
    if items and len(skipped := skipped_texts(items)) == len(items):
        raise NoInputError(f"nothing to embed: {describe_skips(skipped)}")
    try:
        embedder = Embedder(model, device, dtype, attention=attention, max_length=max_length, pooling=pooling,
                            attention_mask=attention_mask, query_prompt=query_prompt,
                            allow_pickle_weights=allow_pickle_weights, dim=dim, quantize=quantize,
                            output_dtype=output_dtype, calibration=calibration_index,
                            engine_factory=_calibration_checked(items)
                            if quantize == "int8" and calibration_index is None else None)
    except (PetalError, click.ClickException) as exc:
        if chunks is None or isinstance(exc, Interrupted):
            raise
        # NOTE: a streamed --stdin loads the model before its first line (a coprocess's first answer does not wait
        # for the load): the model's error stands only once a text to embed arrives; an input that ends without one
        # is no input (66), as the same input read whole. Was: 78 for an empty stdin and a missing --model
        _text_arrives(([utf8_or_bytes(raw) for raw in lines] for lines, _ in chunks), "--stdin is empty")
        raise
    startup_done()  # the model is loaded: from here a long --input collects garbage as usual
    if chunks is not None:
        stdin_texts = (([utf8_or_bytes(raw) for raw in lines], more) for lines, more in chunks)
        _streamed(embedder, stdin_texts, as_query or query_prompt is not None, "--stdin is empty")
        return
    if pieces is not None:
        query, empty = as_query or query_prompt is not None, f"--input {quote_path(input_path)} is empty"
        if output is not None and name_suffix(output) == ".npy":
            with replacing(output) as fh:
                npy = NpyRows(fh)
                _streamed(embedder, ((texts, True) for texts in input_batches), query, empty, npy.add)
                npy.finish()
            return
        window_ids: collections.deque | None = collections.deque() if id_column is not None else None

        def windows() -> Iterator[tuple[list, bool]]:
            for window in input_batches:
                if window_ids is not None:
                    window_ids.extend(window.ids)  # NOTE: taken off as their lines are written
                yield window, True

        if output is None:
            _streamed(embedder, windows(), query, empty, ids=window_ids, write_lines=write_stdout)
            return
        with replacing(output) as fh:
            _streamed(embedder, windows(), query, empty, ids=window_ids,
                      write_lines=lambda lines: fh.writelines(line.encode("utf-8") + b"\n" for line in lines))
        return
    embedded = embedder.embed(items, query=as_query or query_prompt is not None)
    rows, skipped = embedded.rows, embedded.skipped
    if embedded.learned_ranges:
        click.echo(f"petal embed: int8 ranges learned from these {len(items) - len(skipped)} texts (pass "
                   "--calibration INDEX to use an index's)", err=True)
    if output is not None and name_suffix(output) == ".npy":
        with replacing(output) as fh:
            np.save(fh, rows, allow_pickle=False)
    else:
        lines = (_json_line(embedded, i, ids) for i in range(len(items)))
        if output is not None:
            with replacing(output) as fh:
                for line in lines:
                    fh.write(line.encode("utf-8") + b"\n")
        else:
            write_stdout(lines)
    _summary(embedder, len(items), skipped, embedded.truncated, embedded.over_chars)


def _json_line(embedded: Embedded, i: int, ids: Sequence | Mapping[int, Any] | None = None) -> str:
    """The JSON line of input position ``i`` (row ``i - embedded.start``), with its id where ids were read."""
    record: dict = {"index": i}
    if ids is not None:
        record["id"] = ids[i]
    if i in embedded.skipped:
        record.update(embedding=None, skipped=embedded.skipped[i])
    elif (row := embedded.rows[i - embedded.start]).dtype.kind in "iu":  # int8 codes, packed sign bits
        record["embedding"] = row.tolist()
    else:
        # NOTE: each float at the shortest text that reads back as the same float32 (float16): the .npy's and
        # Embedder.encode's values exactly; the embedding goes last, as it always did
        return json.dumps(record, default=str)[:-1] + ', "embedding": ' + float_row_text(row) + "}"
    return json.dumps(record, default=str)


def _streamed(embedder: Embedder, chunks: Iterator[tuple[list, bool]], query: bool, empty: str,
              write_rows: Callable[[np.ndarray], None] | None = None, ids: collections.deque | None = None,
              write_lines: Callable[[list[str]], None] | None = None) -> None:
    """Texts that arrive in chunks, embedded as they come (``Embedder.embed_stream``), in input order: each text's
    JSON line (with its id, taken off the front of ``ids``, where ids are read) is written as soon as it is
    embedded (``write_lines``; default: stdout, flushed, as ``--stdin`` alone answers; the lines before the first
    text embedded are held until it is, so an input with nothing to embed writes nothing); ``write_rows`` takes
    each answer's rows instead (an ``--input`` to FILE.npy). Nothing embedded (empty: ``empty`` says it; blank,
    null or undecodable texts only) is no input (66), as ever."""
    from petal.pipeline.ingest.text_rule import describe_skips
    from petal.pipeline.reliability.errors import NoInputError

    count = truncated = over_chars = 0
    skipped: dict[int, str] = {}
    held: list[str] = []
    for answer in embedder.embed_stream(chunks, query=query):
        count += len(answer.rows)
        truncated += answer.truncated
        over_chars += answer.over_chars
        skipped.update(answer.skipped)
        if write_rows is not None:
            write_rows(answer.rows)
            continue
        answer_ids = None if ids is None else {i: ids.popleft() for i in range(answer.start, count)}
        held += (_json_line(answer, i, answer_ids) for i in range(answer.start, count))
        if len(skipped) < count:
            if write_lines is None:
                write_stdout(held, flush=True)
            else:
                write_lines(held)
            held = []
    if len(skipped) == count:
        raise NoInputError(f"nothing to embed: {describe_skips(skipped) if count else empty}")
    _summary(embedder, count, skipped, truncated, over_chars)


def _text_arrives(chunks: Iterator[list], empty: str) -> None:
    """Reads ``chunks`` (lists of texts: ``--stdin``'s lines, an ``--input``'s record batches) until a text to embed
    arrives, or raises ``NoInputError`` (66) at their end: nothing held one (empty: ``empty`` says it; blank, null
    or undecodable texts only, said by reason as ``_streamed`` says them)."""
    from petal.pipeline.ingest.text_rule import describe_skips
    from petal.pipeline.jobs.embed import skipped_texts
    from petal.pipeline.reliability.errors import NoInputError

    skipped: dict[int, str] = {}
    for texts in chunks:
        found = skipped_texts(texts, len(skipped))
        if len(found) < len(texts):
            return
        skipped.update(found)
    raise NoInputError(f"nothing to embed: {describe_skips(skipped) if skipped else empty}")


def _judged(pieces: Callable[[], Iterator[TextsT]], empty: str, most_held: int = 4) -> Iterator[TextsT]:
    """The batches of ``pieces()``, once ``_text_arrives`` found a text to embed among them (else ``NoInputError``,
    before the model loads): read once where one comes within the first ``most_held`` batches (those are held,
    then given first), else read again from the start (the batches before it are not held)."""
    from petal.pipeline.jobs.embed import skipped_texts

    source = pieces()
    held: list[TextsT] = []
    for texts in source:
        held.append(texts)
        if len(skipped_texts(texts)) < len(texts):

            def replay() -> Iterator[TextsT]:
                while held:
                    yield held.pop(0)  # NOTE: let each held batch go once it is given
                yield from source

            return replay()
        if len(held) == most_held:
            break
    _text_arrives(itertools.chain(held, source), empty)
    return pieces()


class NpyRows:
    """Rows written to an open ``.npy`` file as they come, the header's row count set by ``finish()``: the same
    bytes as ``np.save`` of all of them (numpy pads a header so that its first dimension can grow in place)."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh = fh
        self.count = 0
        self.rows: np.ndarray | None = None  # an empty array of the rows' dtype and width, once one came
        self.data_start = 0  # where the rows begin, after the header

    def _header(self) -> None:
        import numpy as np

        assert self.rows is not None
        np.lib.format.write_array_header_1_0(self.fh, {"descr": np.lib.format.dtype_to_descr(self.rows.dtype),
                                                       "fortran_order": False,
                                                       "shape": (self.count, *self.rows.shape[1:])})

    def add(self, rows: np.ndarray) -> None:
        if self.rows is None:
            self.rows = rows[:0]
            self._header()
            self.data_start = self.fh.tell()
        self.fh.write(rows.tobytes())  # C order, as np.save writes an array
        self.count += len(rows)

    def finish(self) -> None:
        assert self.rows is not None  # NOTE: nothing embedded is no input (66), raised before
        end = self.fh.tell()
        self.fh.seek(0)
        self._header()
        assert self.fh.tell() == self.data_start, "the .npy header changed its length"
        self.fh.seek(end)


def _summary(embedder: Embedder, count: int, skipped: dict[int, str], truncated: int, over_chars: int) -> None:
    """The last line on stderr: texts in, rows out, skips by reason, truncations (``over_chars`` of them at the
    characters petal reads of a text, not at the max length)."""
    from petal.pipeline.ingest.text_rule import describe_skips

    transform = embedder.transform
    at_tokens = truncated - over_chars
    note = f", {at_tokens} truncated at {embedder.max_length} tokens" if at_tokens else ""
    note += f", {over_chars} truncated at {embedder.max_text_chars} characters" if over_chars else ""
    kind = {"none": f"{transform.output_dtype} vectors", "int8": f"int8 codes ({transform.int8_scheme})",
            "binary": "sign bits"}[transform.quantize]
    click.echo(f"petal embed: {count} texts -> {count - len(skipped)} {transform.dim}-dim {kind}, "
               f"{describe_skips(skipped)}{note}", err=True)


def _calibration_checked(items: list) -> Any:
    """The engine factory of ``--quantize int8`` without ``--calibration``: where the model has no int8 scheme of its
    own (its ranges are learned from the texts embedded), fewer than 2 texts to embed is a usage error (2) once the
    model's configuration is read and before its weights load. Was: said after the model had loaded and embedded the
    one text (``calibrating int8 ranges needs at least 2 vectors, got 1``)."""
    from petal.pipeline.ingest.text_rule import skip_reason

    def make(spec: Any, config: Any) -> Any:
        kept = [text for text in items if skip_reason(text) is None]
        if spec.int8_scheme is None and len(set(kept)) < 2:
            got = f"got {len(kept)}" if len(kept) < 2 else f"got {len(kept)} copies of one text"
            raise click.UsageError(f"--quantize int8 learns its ranges from the texts embedded and needs at least 2 "
                                   f"different ones, {got}: embed more texts at once, or take the ranges of an index "
                                   "built with this model (--calibration INDEX)")
        from petal.engine.engine import Engine

        return Engine(spec, config)

    return make


def _check_not_input(output: Path, input_path: Path | None) -> None:
    """``--output`` is not ``--input``'s file, by any path (a symbolic or hard link too): ``UsageError`` (2). NOTE: the
    output replaced the input once every text was embedded (``--input t.jsonl --output t.jsonl``): the texts were
    gone, exit 0."""
    from petal.pipeline.reliability.errors import quote_path
    from petal.pipeline.reliability.output_file import input_written_over

    over = input_written_over(output, [input_path] if input_path is not None else [])
    if over is not None:  # NOTE: a missing --input is said as 66 after this
        raise click.UsageError(f"--output {quote_path(output)} is the --input file{over[1]}; the vectors would be "
                               "written over the texts: write them elsewhere")


class _Window(list):
    """A window of an ``--input``'s texts (a list, as ``_judged`` takes them), and their ``ids`` (``[]`` without
    ``--id-column``)."""

    def __init__(self, texts: list, ids: list) -> None:
        super().__init__(texts)
        self.ids = ids


def _input_pieces(path: Path, text_column: str, id_column: str | None = None) -> Callable[[], Iterator[_Window]]:
    """An ``--input``'s texts and ids a window at a time (each call reads them from the start): a .parquet's record
    batches, a .txt's or .jsonl's lines a piece of the file at a time (``text_file_batches``), after what every input
    file is checked for, as ``_input_texts``; a 0-byte file holds no texts. Windows are of the size ``petal index``
    reads its record batches in for tokenizing (``window_read``), so what is held stays a few windows."""
    from petal.pipeline.reliability.safe_files import input_file_size

    if input_file_size("--input", path) == 0:  # NOTE: a missing or unreadable file (66) before Arrow is imported
        return lambda: iter(())
    from petal.pipeline.config import ReadConfig
    from petal.pipeline.ingest.documents import window_read
    from petal.pipeline.ingest.texts import text_file_batches

    read = window_read(ReadConfig())
    return lambda: (_Window(texts, ids) for texts, ids in text_file_batches(path, text_column, id_column, read))


def _input_texts(path: Path, text_column: str, id_column: str | None) -> tuple[list, list | None]:
    """``--input``'s texts and ids (``read_texts``), after what the flag alone decides (its suffix, exit 2) and
    what every input file is checked for (missing, not a regular file, unreadable: 66, naming it). An empty file
    (0 bytes) holds no texts, whatever its format (a 0-byte ``.parquet`` too: no rows, not a corrupt file)."""
    from petal.pipeline.ingest.texts import TEXT_FILE_SUFFIXES, read_texts
    from petal.pipeline.reliability.errors import UsageError, quote_path
    from petal.pipeline.reliability.safe_files import input_file_size

    suffix = name_suffix(path)
    if suffix not in TEXT_FILE_SUFFIXES:
        raise UsageError(f"--input {quote_path(path)}: expected a .parquet, .txt or .jsonl file")
    if suffix == ".txt" and id_column is not None:
        raise UsageError("--id-column goes with --input FILE.parquet or FILE.jsonl")
    if input_file_size("--input", path) == 0:
        return [], [] if id_column is not None else None
    return read_texts(path, text_column, id_column)


@contextlib.contextmanager
def replacing(output: Path) -> Iterator[IO[bytes]]:
    """A binary file to write ``--output`` into, whole or not at all: a temporary file beside it (``.NAME.tmp-PID``,
    same directory, so same file system), fsynced, then renamed over it (and the directory fsynced). On any
    failure (an error while the rows are written, a full or failing disk, SIGINT or SIGTERM) the temporary file is
    removed and an existing ``output`` is left as it was; exit codes: a disk error 74 naming ``output``, a signal
    128 + its number. A symlink to a regular file has the file it names replaced; a path that is not a regular
    file (a FIFO, a device) is written in place, never renamed over. Only a SIGKILL (or a crash of the machine)
    can leave the temporary file behind; a later run of the same process id removes it."""
    from petal.pipeline.reliability.durable import fsync_dir, temporary_beside

    try:
        mode: int | None = os.stat(output).st_mode  # follows symlinks: what the path leads to
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise write_error(output, exc) from exc
    if mode is not None and not stat.S_ISREG(mode):  # NOTE: a FIFO or a device: no temporary file, no rename
        try:
            with open(output, "wb") as fh:
                if name_suffix(output) != ".npy":
                    yield fh
                    return
                # NOTE: a .npy is written with a file position (numpy's tofile; the streamed rows' header rewritten
                # with their count at the end): on a pipe that was 'Illegal seek' (74) after the header alone. It is
                # made in an unnamed temporary file, then copied into the FIFO or device whole
                import shutil
                import tempfile

                with tempfile.TemporaryFile() as spool:
                    yield spool
                    spool.seek(0)
                    shutil.copyfileobj(spool, fh, 1 << 20)
        except OSError as exc:
            raise write_error(output, exc) from exc
        return
    target = output.resolve() if output.is_symlink() else output
    tmp = temporary_beside(target)
    with _stop_signals_raise(output):
        try:
            # NOTE: a leftover (or planted) temporary file is removed first and the new one created exclusively,
            # never through a symlink
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
            if mode is not None:
                with contextlib.suppress(OSError):  # the file replaced keeps its permissions
                    os.fchmod(fd, stat.S_IMODE(mode))
            with os.fdopen(fd, "wb") as fh:
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise write_error(output, exc) from exc
            raise
    with contextlib.suppress(OSError):  # NOTE: the file is in place; a directory that cannot be fsynced is no failure
        fsync_dir(target.parent)


@contextlib.contextmanager
def _stop_signals_raise(output: Path) -> Iterator[None]:
    """While ``--output`` is written: a stop signal (SIGINT, SIGTERM, SIGHUP, ...) raises ``Interrupted`` at once
    (exit 128 + its number), so the temporary file is removed on the way out (its default would end the process
    with the file left behind); the previous handlers come back after."""
    import signal
    import threading

    from petal.pipeline.reliability.errors import Interrupted, quote_path
    from petal.pipeline.reliability.signals import not_ignored

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        for sig in previous:  # NOTE: a second signal ends the process at once (the kernel's default)
            signal.signal(sig, signal.SIG_DFL)
        interrupted = Interrupted(signum)
        interrupted.args = (f"interrupted by {signal.Signals(signum).name} while writing --output "
                            f"{quote_path(output)}; nothing was written to it",)
        raise interrupted

    previous = {sig: signal.signal(sig, stop) for sig in not_ignored()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
